/* Status strings and the per-thread detailed error message. */
#include <stdio.h>
#include <string.h>

#include "common.h"

static _Thread_local hvd_status last_status;
static _Thread_local char last_message[HVD_ERROR_MESSAGE_MAX];

HVD_API const char *hvd_strerror(hvd_status status) {
  switch (status) {
  case HVD_OK: return "success";
  case HVD_ERR_INVALID_ARGUMENT: return "invalid argument";
  case HVD_ERR_NO_MEMORY: return "out of memory";
  case HVD_ERR_TIMEOUT: return "timed out";
  case HVD_ERR_NOT_FOUND: return "not found";
  case HVD_ERR_IO: return "system call failed";
  case HVD_ERR_NETWORK: return "network error";
  case HVD_ERR_PROTOCOL: return "protocol error";
  case HVD_ERR_UNAUTHORIZED: return "unauthorized";
  case HVD_ERR_TOO_LARGE: return "too large";
  case HVD_ERR_CONFLICT: return "conflict";
  case HVD_ERR_UNSUPPORTED: return "unsupported";
  case HVD_ERR_PRECONDITION: return "wrong state";
  case HVD_ERR_ABORTED: return "aborted";
  case HVD_ERR_INTERNAL: return "internal error";
  case HVD_ERR_MISMATCH: return "ranks disagree about an operation";
  case HVD_ERR_HOSTS_UPDATED: return "hosts were added or removed (elastic reset)";
  case HVD_ERR_REMOVED: return "this worker was removed from the elastic job";
  case HVD_ERR_EXISTS: return "exists already";
  }
  return "unknown status";
}

HVD_API const char *hvd_last_error_message(void) { return last_message; }

#define STRINGIFY_(x) #x
#define STRINGIFY(x) STRINGIFY_(x)

HVD_API const char *hvd_version(void) {
  return STRINGIFY(HVD_VERSION_MAJOR) "." STRINGIFY(HVD_VERSION_MINOR) "." STRINGIFY(
      HVD_VERSION_PATCH);
}

hvd_status hvd_error(hvd_status status, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(last_message, sizeof(last_message), fmt, ap);
  va_end(ap);
  last_status = status;
  return status;
}

hvd_status hvd_error_prefix(const char *fmt, ...) {
  char prefix[HVD_ERROR_MESSAGE_MAX / 2];
  size_t plen, mlen;
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(prefix, sizeof(prefix) - 2, fmt, ap);
  va_end(ap);
  strcat(prefix, ": ");
  plen = strlen(prefix);
  mlen = strlen(last_message);
  if (mlen > sizeof(last_message) - 1 - plen)
    mlen = sizeof(last_message) - 1 - plen;
  memmove(last_message + plen, last_message, mlen);
  memcpy(last_message, prefix, plen);
  last_message[plen + mlen] = '\0';
  return last_status;
}

hvd_status hvd_error_status(void) { return last_status; }

void hvd_error_clear(void) {
  last_status = HVD_OK;
  last_message[0] = '\0';
}
