/* A rendezvous store in a process of its own (see store_process.h). */
#include "store_process.h"

#include <check.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rendezvous/rendezvous.h"

void store_process_start(struct store_process *p) {
  int port_pipe[2], ctl_pipe[2];

  ck_assert_int_eq(pipe(port_pipe), 0);
  ck_assert_int_eq(pipe(ctl_pipe), 0);
  p->pid = fork();
  ck_assert_int_ge(p->pid, 0);
  if (p->pid == 0) {
    struct rdzv_server_config cfg;
    struct rdzv_server *srv = NULL;
    int port = -1;
    char byte;
    close(port_pipe[0]);
    close(ctl_pipe[1]);
    alarm(900);
    rdzv_server_config_default(&cfg);
    cfg.bind_address = "127.0.0.1";
    if (rdzv_server_start(&cfg, &srv) == HVD_OK)
      port = rdzv_server_port(srv);
    if (write(port_pipe[1], &port, sizeof(port)) != sizeof(port) || port < 0)
      _exit(1);
    while (read(ctl_pipe[0], &byte, 1) > 0) {
    }
    rdzv_server_stop(srv);
    _exit(0);
  }
  close(port_pipe[1]);
  close(ctl_pipe[0]);
  ck_assert_int_eq(read(port_pipe[0], &p->port, sizeof(p->port)), sizeof(p->port));
  ck_assert_int_gt(p->port, 0);
  close(port_pipe[0]);
  p->ctl = ctl_pipe[1];
}

void store_process_stop(struct store_process *p) {
  close(p->ctl);
  waitpid(p->pid, NULL, 0);
}
