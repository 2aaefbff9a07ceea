/*
 * MUNGE credentials, the proof of identity every Slurm cluster already has:
 * munged on each node signs a credential with the cluster's shared key,
 * and any node's munged tells who made it (uid), refusing it once it has
 * been decoded before or has expired (five minutes).
 *
 * DESIGN. libmunge is loaded when first needed (dlopen), so that libhvd
 * does not depend on it where MUNGE is not used; the build only needs its
 * header. HVD_MUNGE_SOCKET names munged's socket where it is not
 * libmunge's default (Slurm's AuthInfo=socket=... says where).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launch.h"

#if defined(__has_include)
#if __has_include(<munge.h>)
#include <munge.h>
#define HVD_HAVE_MUNGE 1
#endif
#endif

#ifdef HVD_HAVE_MUNGE
static struct {
  __typeof__(&munge_ctx_create) ctx_create;
  __typeof__(&munge_ctx_destroy) ctx_destroy;
  __typeof__(&munge_ctx_set) ctx_set;
  __typeof__(&munge_encode) encode;
  __typeof__(&munge_decode) decode;
  __typeof__(&munge_strerror) strerror;
} lib;
static pthread_once_t lib_once = PTHREAD_ONCE_INIT;
static char lib_error[200];

static void load(void) {
  void *h = dlopen("libmunge.so.2", RTLD_NOW | RTLD_LOCAL);
  if (h == NULL) {
    snprintf(lib_error, sizeof(lib_error), "%s", dlerror());
    return;
  }
  *(void **)&lib.ctx_create = dlsym(h, "munge_ctx_create");
  *(void **)&lib.ctx_destroy = dlsym(h, "munge_ctx_destroy");
  *(void **)&lib.ctx_set = dlsym(h, "munge_ctx_set");
  *(void **)&lib.encode = dlsym(h, "munge_encode");
  *(void **)&lib.decode = dlsym(h, "munge_decode");
  *(void **)&lib.strerror = dlsym(h, "munge_strerror");
  if (lib.ctx_create == NULL || lib.ctx_destroy == NULL || lib.ctx_set == NULL ||
      lib.encode == NULL || lib.decode == NULL || lib.strerror == NULL) {
    snprintf(lib_error, sizeof(lib_error), "libmunge.so.2 lacks a function hvd uses");
    memset(&lib, 0, sizeof(lib));
  }
}

/* A context for HVD_MUNGE_SOCKET's munged. */
static hvd_status context(munge_ctx_t *out) {
  const char *socket = hvd_setting_real(HVD_SET_MUNGE_SOCKET);
  munge_ctx_t ctx;

  pthread_once(&lib_once, load);
  if (lib.encode == NULL)
    return hvd_error(HVD_ERR_UNSUPPORTED, "MUNGE is not available (%s)", lib_error);
  if ((ctx = lib.ctx_create()) == NULL)
    return hvd_error(HVD_ERR_NO_MEMORY, "munge_ctx_create failed");
  if (socket != NULL && lib.ctx_set(ctx, MUNGE_OPT_SOCKET, socket) != EMUNGE_SUCCESS) {
    lib.ctx_destroy(ctx);
    return hvd_error(HVD_ERR_INVALID_ARGUMENT, "HVD_MUNGE_SOCKET='%.100s' is not usable", socket);
  }
  *out = ctx;
  return HVD_OK;
}

hvd_status launch_munge_encode(const char *payload, char **out) {
  munge_ctx_t ctx;
  munge_err_t e;
  char *cred = NULL;
  hvd_status st = context(&ctx);

  if (st != HVD_OK)
    return st;
  e = lib.encode(&cred, ctx, payload, (int)strlen(payload));
  lib.ctx_destroy(ctx);
  if (e != EMUNGE_SUCCESS)
    return hvd_error(e == EMUNGE_SOCKET ? HVD_ERR_UNSUPPORTED : HVD_ERR_IO,
                     "MUNGE cannot make a credential: %s", lib.strerror(e));
  *out = cred;
  return HVD_OK;
}

hvd_status launch_munge_decode(const char *cred, uid_t *uid, char **payload) {
  munge_ctx_t ctx;
  munge_err_t e;
  void *buf = NULL;
  int len = 0;
  gid_t gid;
  char *text;
  hvd_status st = context(&ctx);

  if (st != HVD_OK)
    return st;
  e = lib.decode(cred, ctx, &buf, &len, uid, &gid);
  lib.ctx_destroy(ctx);
  if (e != EMUNGE_SUCCESS) {
    free(buf);
    return hvd_error(HVD_ERR_UNAUTHORIZED, "the MUNGE credential is not valid: %s",
                     lib.strerror(e));
  }
  text = malloc((size_t)len + 1);
  if (text == NULL) {
    free(buf);
    return hvd_error(HVD_ERR_NO_MEMORY, "cannot copy a credential's payload");
  }
  memcpy(text, buf != NULL ? buf : "", (size_t)len);
  text[len] = '\0';
  free(buf);
  *payload = text;
  return HVD_OK;
}

#else /* no <munge.h> at build time */

hvd_status launch_munge_encode(const char *payload, char **out) {
  (void)payload;
  (void)out;
  return hvd_error(HVD_ERR_UNSUPPORTED, "this hvd was built without MUNGE (libmunge-dev)");
}

hvd_status launch_munge_decode(const char *cred, uid_t *uid, char **payload) {
  (void)cred;
  (void)uid;
  (void)payload;
  return hvd_error(HVD_ERR_UNSUPPORTED, "this hvd was built without MUNGE (libmunge-dev)");
}

#endif
