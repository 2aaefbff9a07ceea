/*
 * The etcd test harness itself (etcd_cluster.h), against real etcd: the
 * tests of the etcd rendezvous store stand on it, so it is checked first.
 *   three  a 3-member cluster: a key written, the leader killed with
 *          kill -9, a new leader, the key read from the survivors, the
 *          member restarted from its data; two members paused (no quorum:
 *          no leader, writes fail), continued (a leader again)
 *   one    a 1-member cluster: keys, a restart keeps them, the test's open
 *          files stay out of etcd; auth on: no token and a wrong password
 *          refused, root's password accepted; the test process dies
 *          without stopping it (its member paused), and the member and its
 *          files go
 * main exits 77 (ctest's skip) where etcd is not installed.
 */
#include <check.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "etcd_cluster.h"

static struct etcd_cluster cluster;

static void teardown(void) { etcd_cluster_stop(&cluster); }

/* Threads of this process (the harness must leave none behind: ranks are
 * forked from here). */
static int threads(void) {
  char line[256];
  int n = -1;
  FILE *f = fopen("/proc/self/status", "r");
  while (f != NULL && fgets(line, sizeof(line), f) != NULL)
    if (sscanf(line, "Threads: %d", &n) == 1)
      break;
  if (f != NULL)
    fclose(f);
  return n;
}

/* Whether pid is gone (or a zombie nobody reaped yet). */
static bool gone(pid_t pid) {
  char path[64], text[512];
  FILE *f;
  char *paren;
  size_t n;
  if (kill(pid, 0) != 0 && errno == ESRCH)
    return true;
  snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
  f = fopen(path, "r");
  if (f == NULL)
    return true;
  n = fread(text, 1, sizeof(text) - 1, f);
  fclose(f);
  text[n] = '\0';
  paren = strrchr(text, ')');
  return paren != NULL && paren[1] == ' ' && paren[2] == 'Z';
}

static void expect_value(int member, const char *key, const char *want) {
  char *got = etcd_cluster_get(&cluster, member, key);
  ck_assert_msg(got != NULL, "member %d: %s is absent, want '%s'", member, key, want);
  ck_assert_msg(strcmp(got, want) == 0, "member %d: %s is '%s', want '%s'", member, key, got,
                want);
  free(got);
}

/* Whether process pid holds an open file with inode ino (a pipe's). */
static bool holds_inode(pid_t pid, ino_t ino) {
  char dir[64], path[512], link[128], want[64];
  struct dirent *e;
  bool found = false;
  DIR *d;
  snprintf(dir, sizeof(dir), "/proc/%d/fd", (int)pid);
  snprintf(want, sizeof(want), "pipe:[%lu]", (unsigned long)ino);
  d = opendir(dir);
  ck_assert_msg(d != NULL, "%s: %s", dir, strerror(errno));
  while (!found && (e = readdir(d)) != NULL) {
    ssize_t n;
    snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
    n = readlink(path, link, sizeof(link) - 1);
    if (n > 0) {
      link[n] = '\0';
      found = strcmp(link, want) == 0;
    }
  }
  closedir(d);
  return found;
}

/* ==== three members ============================================================== */

START_TEST(leader_killed_and_restarted) {
  int before = threads(), leader, next, other = -1;
  char want[64] = "";

  etcd_cluster_start(&cluster, 3);
  for (int i = 0; i < 3; i++) {
    char ep[32];
    snprintf(ep, sizeof(ep), "%s127.0.0.1:%d", i > 0 ? "," : "", cluster.members[i].client_port);
    strcat(want, ep);
  }
  ck_assert_str_eq(etcd_cluster_endpoints(&cluster), want);
  leader = etcd_cluster_leader(&cluster);
  etcd_cluster_put(&cluster, leader, "hvd/test/key", "value before the kill");

  etcd_cluster_kill(&cluster, leader);
  ck_assert_int_eq(cluster.members[leader].keeper, 0);
  next = etcd_cluster_leader(&cluster);
  ck_assert_int_ne(next, leader);
  for (int i = 0; i < 3; i++)
    if (i != leader && i != next)
      other = i;
  expect_value(next, "hvd/test/key", "value before the kill");
  expect_value(other, "hvd/test/key", "value before the kill");
  etcd_cluster_put(&cluster, other, "hvd/test/later", "written by two of three");

  etcd_cluster_restart(&cluster, leader);
  ck_assert_int_gt(cluster.members[leader].keeper, 0);
  expect_value(leader, "hvd/test/key", "value before the kill");
  expect_value(leader, "hvd/test/later", "written by two of three");
  ck_assert_int_ge(etcd_cluster_leader(&cluster), 0);
  ck_assert_int_eq(threads(), before);
}
END_TEST

START_TEST(quorum_lost_and_regained) {
  char *reply = NULL;
  int leader, a, b, http;

  etcd_cluster_start(&cluster, 3);
  leader = etcd_cluster_leader(&cluster);
  a = (leader + 1) % 3;
  b = (leader + 2) % 3;
  etcd_cluster_pause(&cluster, a);
  etcd_cluster_pause(&cluster, b);
  /* The lone leader steps down once it misses a quorum (check-quorum). */
  for (int i = 0; i < 100 && etcd_cluster_wait_leader(&cluster, 0) >= 0; i++)
    usleep(50000);
  ck_assert_int_eq(etcd_cluster_wait_leader(&cluster, 0), -1);
  http = etcd_cluster_post(&cluster, leader, "/v3/kv/put",
                           "{\"key\":\"aHZkL3E=\",\"value\":\"eA==\"}", 500, &reply);
  ck_assert_msg(http != 200, "a put without quorum answered 200: %s", reply);
  free(reply);

  etcd_cluster_resume(&cluster, a);
  etcd_cluster_resume(&cluster, b);
  ck_assert_int_ge(etcd_cluster_leader(&cluster), 0);
  etcd_cluster_put(&cluster, -1, "hvd/test/after", "quorum again");
  expect_value(a, "hvd/test/after", "quorum again");
}
END_TEST

/* ==== one member ================================================================= */

START_TEST(single_member_keys_survive_restart) {
  struct stat st;
  char want[32];
  int fds[2];

  /* A pipe of the test's, open without O_CLOEXEC, stays out of etcd. */
  ck_assert_int_eq(pipe(fds), 0);
  ck_assert_int_eq(fstat(fds[1], &st), 0);
  etcd_cluster_start(&cluster, 1);
  ck_assert_msg(!holds_inode(cluster.members[0].pid, st.st_ino), "etcd inherited a pipe");
  ck_assert_msg(!holds_inode(cluster.members[0].keeper, st.st_ino), "the keeper has a pipe");
  close(fds[0]);
  close(fds[1]);
  snprintf(want, sizeof(want), "127.0.0.1:%d", cluster.members[0].client_port);
  ck_assert_str_eq(etcd_cluster_endpoints(&cluster), want);
  ck_assert_int_eq(etcd_cluster_leader(&cluster), 0);
  ck_assert_ptr_null(etcd_cluster_get(&cluster, 0, "hvd/absent"));
  etcd_cluster_put(&cluster, 0, "hvd/empty", "");
  etcd_cluster_put(&cluster, 0, "hvd/bytes", "a=b&c\"d\\e/f?\xc3\xa9");
  expect_value(0, "hvd/empty", "");
  expect_value(0, "hvd/bytes", "a=b&c\"d\\e/f?\xc3\xa9");

  etcd_cluster_kill(&cluster, 0);
  ck_assert_int_eq(etcd_cluster_wait_leader(&cluster, 0), -1);
  etcd_cluster_restart(&cluster, 0);
  expect_value(0, "hvd/bytes", "a=b&c\"d\\e/f?\xc3\xa9");
}
END_TEST

START_TEST(auth_refuses_wrong_credentials) {
  char *reply = NULL;
  int http;

  etcd_cluster_start(&cluster, 1);
  etcd_cluster_put(&cluster, 0, "hvd/secret", "before auth");
  etcd_cluster_enable_auth(&cluster, "s3cret pass");
  expect_value(0, "hvd/secret", "before auth");

  strcpy(cluster.password, "");
  http = etcd_cluster_post(&cluster, 0, "/v3/kv/range", "{\"key\":\"aHZkL3NlY3JldA==\"}", 5000,
                           &reply);
  ck_assert_msg(http != 200 && strstr(reply, "user name is empty") != NULL,
                "no token: HTTP %d: %s", http, reply);
  free(reply);

  strcpy(cluster.password, "wrong");
  http = etcd_cluster_post(&cluster, 0, "/v3/kv/range", "{\"key\":\"aHZkL3NlY3JldA==\"}", 5000,
                           &reply);
  ck_assert_msg(http == -1 && strstr(reply, "authentication failed") != NULL,
                "wrong password: HTTP %d: %s", http, reply);
  free(reply);

  strcpy(cluster.password, "s3cret pass");
  expect_value(0, "hvd/secret", "before auth");
}
END_TEST

/* A test process that exits without etcd_cluster_stop takes its members
 * and their files with it, paused members too. */
START_TEST(members_die_with_the_test_process) {
  struct etcd_cluster lost;
  int pfd[2], status;
  struct stat st;
  pid_t child;

  ck_assert_int_eq(pipe(pfd), 0);
  child = fork();
  ck_assert_int_ge(child, 0);
  if (child == 0) {
    close(pfd[0]);
    etcd_cluster_start(&lost, 1);
    etcd_cluster_pause(&lost, 0); /* its keeper then gets SIGHUP too */
    _exit(write(pfd[1], &lost, sizeof(lost)) == (ssize_t)sizeof(lost) ? 0 : 1);
  }
  close(pfd[1]);
  ck_assert_int_eq(read(pfd[0], &lost, sizeof(lost)), (ssize_t)sizeof(lost));
  close(pfd[0]);
  ck_assert_int_eq(waitpid(child, &status, 0), child);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "child status %d", status);
  for (int i = 0; i < 100 && !(gone(lost.members[0].pid) && stat(lost.dir, &st) != 0); i++)
    usleep(50000);
  ck_assert_msg(gone(lost.members[0].pid), "etcd %d outlived the test process",
                (int)lost.members[0].pid);
  ck_assert_msg(stat(lost.dir, &st) != 0, "%s outlived the test process", lost.dir);
}
END_TEST

static Suite *three_suite(void) {
  Suite *s = suite_create("three");
  TCase *tc = tcase_create("three");
  tcase_add_checked_fixture(tc, NULL, teardown);
  tcase_add_test(tc, leader_killed_and_restarted);
  tcase_add_test(tc, quorum_lost_and_regained);
  suite_add_tcase(s, tc);
  return s;
}

static Suite *one_suite(void) {
  Suite *s = suite_create("one");
  TCase *tc = tcase_create("one");
  tcase_add_checked_fixture(tc, NULL, teardown);
  tcase_add_test(tc, single_member_keys_survive_restart);
  tcase_add_test(tc, auth_refuses_wrong_credentials);
  tcase_add_test(tc, members_die_with_the_test_process);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  const char *missing = etcd_cluster_missing();
  SRunner *sr;
  int failed;

  if (missing != NULL) {
    printf("skipped: %s\n", missing);
    return 77;
  }
  sr = srunner_create(three_suite());
  srunner_add_suite(sr, one_suite());
  srunner_run_all(sr, CK_NORMAL);
  failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}
