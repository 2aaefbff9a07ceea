/* A rendezvous store in a process of its own (see store_process.h). */
#include "store_process.h"

#include <check.h>

void store_process_start(struct store_process *p) {
  struct rdzv_server_config cfg;
  rdzv_server_config_default(&cfg);
  cfg.bind_address = "127.0.0.1";
  ck_assert_msg(rdzv_server_child_start(&cfg, 900, &p->child) == HVD_OK, "%s",
                hvd_last_error_message());
  p->port = p->child.port;
}

void store_process_stop(struct store_process *p) { rdzv_server_child_stop(&p->child); }
