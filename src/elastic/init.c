/*
 * hvd_init and hvd_shutdown: the entry that chooses how this process
 * starts (a plain start, a pod of hvd-rendezvous's elastic driver, or a
 * worker of hvdrun's elastic driver that may have to wait for the next
 * round) and what it leaves (the state, and a pod's membership). Building
 * and tearing down the state is coord's (coord/lifecycle.c).
 */
#include "elastic.h"
#include "launch/launch.h"

HVD_API hvd_status hvd_init(void) {
  struct elastic_env env;
  struct coord_start how = {0};
  hvd_status st;

  /* Under Slurm, torchrun or an Indexed Job, hvd's variables come from
   * theirs (and rank 0 hosts the store) before anything reads them. */
  if (!hvd_is_initialized() && launch_prepare() != HVD_OK)
    return hvd_error_prefix("hvd_init");
  if (elastic_read_env(&env) != HVD_OK)
    return hvd_error_prefix("hvd_init");
  /* A pod of an elastic job learns its round from hvd-rendezvous's driver
   * (hvd already up is coord_init_state's to report). */
  if (env.pod && !hvd_is_initialized() && !coord_is_removed())
    return elastic_pod_join(&env);
  how.elastic = env.elastic;
  how.generation = env.round;
  how.updates = env.updates;
  st = coord_init_state(&how);
  if (st == HVD_OK && env.elastic && (st = elastic_started()) != HVD_OK) {
    (void)coord_shutdown_state();
    hvd_error_prefix("hvd_init");
  }

  /* A new elastic worker whose first round fails to start (another one
   * died meanwhile) joins the next round instead of failing. */
  if (st != HVD_OK && elastic_recoverable(st) && env.elastic) {
    HVD_LOG_INFO("elastic: round %llu failed to start (%s); waiting for the next one",
                 (unsigned long long)env.round, hvd_last_error_message());
    st = elastic_rejoin(&env, env.round);
  }
  return st;
}

HVD_API hvd_status hvd_shutdown(void) {
  hvd_status st = coord_shutdown_state();
  if (st != HVD_OK)
    return st; /* a completion callback: nothing was done */
  elastic_stopping();
  elastic_pod_leave();
  return HVD_OK;
}
