/* The rendezvous server's listening socket (listen.c). */
#ifndef HVD_RENDEZVOUS_LISTEN_H
#define HVD_RENDEZVOUS_LISTEN_H

#include <sys/socket.h>

#include "common/common.h"

/* "ADDR:PORT", IPv6 addresses in brackets. */
void rdzv_format_address(const struct sockaddr *sa, char *out, size_t size);

/*
 * Binds and listens (non-blocking, close-on-exec). bind_address NULL or ""
 * means every interface, IPv6 and IPv4 (IPv4 only where IPv6 is off); port 0
 * picks a free port. The bound "ADDR:PORT" goes to address.
 */
hvd_status rdzv_listen(const char *bind_address, int port, int *fd, char *address,
                       size_t address_size, int *bound_port);

#endif
