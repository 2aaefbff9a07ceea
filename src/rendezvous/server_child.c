/*
 * A rendezvous server in a child process of its own (see rendezvous.h).
 * The child reports its port (or -1) through a pipe, then serves until the
 * parent closes the control pipe: also when the parent dies, so a crashed
 * benchmark or test leaves no server behind.
 */
#include <errno.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rendezvous/rendezvous.h"

hvd_status rdzv_server_child_start(const struct rdzv_server_config *cfg, unsigned max_lifetime_s,
                                   struct rdzv_server_child *out) {
  int port_pipe[2], ctl_pipe[2], port = -1;

  out->pid = -1;
  out->ctl = -1;
  out->port = -1;
  if (pipe(port_pipe) != 0)
    return hvd_error(HVD_ERR_IO, "pipe: %s", strerror(errno));
  if (pipe(ctl_pipe) != 0) {
    int err = errno;
    close(port_pipe[0]);
    close(port_pipe[1]);
    return hvd_error(HVD_ERR_IO, "pipe: %s", strerror(err));
  }
  out->pid = fork();
  if (out->pid < 0) {
    int err = errno;
    close(port_pipe[0]);
    close(port_pipe[1]);
    close(ctl_pipe[0]);
    close(ctl_pipe[1]);
    return hvd_error(HVD_ERR_IO, "fork: %s", strerror(err));
  }
  if (out->pid == 0) {
    struct rdzv_server *srv = NULL;
    char byte;
    close(port_pipe[0]);
    close(ctl_pipe[1]);
    if (max_lifetime_s > 0)
      alarm(max_lifetime_s);
    if (rdzv_server_start(cfg, &srv) == HVD_OK)
      port = rdzv_server_port(srv);
    else
      HVD_LOG_ERROR("rendezvous server: %s", hvd_last_error_message());
    if (write(port_pipe[1], &port, sizeof(port)) != sizeof(port) || port < 0)
      _exit(1);
    while (read(ctl_pipe[0], &byte, 1) > 0) {
    }
    rdzv_server_stop(srv);
    _exit(0);
  }
  close(port_pipe[1]);
  close(ctl_pipe[0]);
  out->ctl = ctl_pipe[1];
  if (read(port_pipe[0], &port, sizeof(port)) != sizeof(port) || port <= 0) {
    close(port_pipe[0]);
    rdzv_server_child_stop(out);
    return hvd_error(HVD_ERR_IO, "the rendezvous server process did not start (see its error)");
  }
  close(port_pipe[0]);
  out->port = port;
  return HVD_OK;
}

void rdzv_server_child_stop(struct rdzv_server_child *child) {
  if (child->ctl >= 0)
    close(child->ctl);
  if (child->pid > 0)
    waitpid(child->pid, NULL, 0);
  child->ctl = -1;
  child->pid = -1;
}
