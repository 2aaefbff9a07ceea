/*
 * A rendezvous store in a process of its own, for the multi-process tests:
 * the test process stays free of threads, so forking ranks from it is safe
 * (a fork taken while another thread holds a lock, the allocator's for
 * one, can leave the child stuck on it).
 */
#ifndef HVD_TEST_STORE_PROCESS_H
#define HVD_TEST_STORE_PROCESS_H

#include "rendezvous/rendezvous.h"

struct store_process {
  struct rdzv_server_child child;
  int port; /* where it listens, on 127.0.0.1 */
};

/* Starts the store (ck_asserts on failure); it gives up after 900 s. */
void store_process_start(struct store_process *p);
void store_process_stop(struct store_process *p);

#endif
