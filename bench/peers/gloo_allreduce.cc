/*
 * gloo_allreduce: Gloo's allreduce algorithms (float32 sum) over its TCP
 * transport on loopback, the peer that bench/compare_allreduce.sh sets
 * beside hvd-bench. Start N processes with --rank 0..N-1 --size N and the
 * same fresh --store directory (a gloo::rendezvous::FileStore).
 *
 * DESIGN. Each algorithm gets its own TCP device and context (one full mesh),
 * connected through the store under its own prefix: running an old-API
 * algorithm and then the new-API gloo::allreduce on one context made the new
 * API ~100x slower at np=4 (research/peer-baselines.md, note 9a). Barriers,
 * the agreement on op counts and the max/sum of results go through a
 * separate control context, never the one being measured.
 *
 * Per size, as in mpi_allreduce.c: fill the input with rank+1, run one op and
 * check every element against N(N+1)/2, finish the warmup, calibrate the op
 * count to about --target seconds unless -n fixes it (at least 3 ops), then
 * a control barrier and a timed batch; rank 0 reports the max over ranks of
 * the batch time divided by the op count. The new API runs out-of-place and
 * its last timed output is checked. The legacy algorithms reduce in place,
 * so during the timed batch the values grow to +inf (no NaN, no slow path);
 * afterwards the input is refilled and one more op is checked. Each rank
 * names its first wrong element on stderr.
 *
 * Output: for each algorithm a "# algorithm: NAME" line, then nccl-tests
 * columns (see bench/peers/README.md), one line per size, from rank 0.
 */
#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include <gloo/allreduce.h>
#include <gloo/allreduce_bcube.h>
#include <gloo/allreduce_halving_doubling.h>
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/barrier_all_to_all.h>
#include <gloo/config.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>

namespace {

constexpr long kMinIters = 3;
const char* const kAllAlgos = "new_ring,new_bcube,ring,ring_chunked,halving_doubling,bcube";

struct Options {
  int rank = -1;
  int size = 0;
  std::string store;
  std::vector<std::string> algos;
  std::vector<size_t> sizes;
  long iters = 0; // 0: sized to target
  long warmup = 5;
  double target = 0.4;
  int timeoutSec = 120;
};

double now() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

bool parseSize(const char* s, size_t* out) {
  char* end;
  unsigned long long v = strtoull(s, &end, 10);
  if (end == s) {
    return false;
  }
  switch (*end) {
    case 'K': case 'k': v <<= 10; end++; break;
    case 'M': case 'm': v <<= 20; end++; break;
    case 'G': case 'g': v <<= 30; end++; break;
    default: break;
  }
  if (*end == 'B' || *end == 'b') {
    end++;
  }
  if (*end != '\0') {
    return false;
  }
  *out = (size_t)v;
  return true;
}

std::vector<std::string> splitComma(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) {
      out.push_back(item);
    }
  }
  return out;
}

void usage(const char* argv0) {
  fprintf(stderr,
      "usage: %s --rank R --size N --store DIR [--algos LIST] [--timeout S]\n"
      "          [-b MIN -e MAX -f FACTOR | SIZE...] [-n ITERS] [-w WARMUP] [-t SECONDS]\n"
      "  LIST: comma-separated subset of %s (default: all)\n"
      "  sizes in bytes, K/M/G suffixes (1024-based); -n 0 (default) sizes each\n"
      "  timed run to about -t seconds (default 0.4); -w default 5\n",
      argv0, kAllAlgos);
}

bool parseArgs(int argc, char** argv, Options* o) {
  static const struct option longOpts[] = {
      {"rank", required_argument, nullptr, 'R'},
      {"size", required_argument, nullptr, 'N'},
      {"store", required_argument, nullptr, 'S'},
      {"algos", required_argument, nullptr, 'A'},
      {"timeout", required_argument, nullptr, 'T'},
      {"help", no_argument, nullptr, 'h'},
      {nullptr, 0, nullptr, 0},
  };
  size_t b = 0, e = 0;
  unsigned long f = 2;
  bool haveRange = false;
  std::string algos = kAllAlgos;
  int c;
  while ((c = getopt_long(argc, argv, "b:e:f:n:w:t:c:h", longOpts, nullptr)) != -1) {
    switch (c) {
      case 'R': o->rank = atoi(optarg); break;
      case 'N': o->size = atoi(optarg); break;
      case 'S': o->store = optarg; break;
      case 'A': algos = optarg; break;
      case 'T': o->timeoutSec = atoi(optarg); break;
      case 'b': if (!parseSize(optarg, &b)) return false; haveRange = true; break;
      case 'e': if (!parseSize(optarg, &e)) return false; haveRange = true; break;
      case 'f': f = strtoul(optarg, nullptr, 10); break;
      case 'n': o->iters = atol(optarg); break;
      case 'w': o->warmup = atol(optarg); break;
      case 't': o->target = atof(optarg); break;
      case 'c': break; // nccl-tests' check flag: we always check
      default: return false;
    }
  }
  if (haveRange) {
    if (b == 0 || e < b || f < 2) {
      return false;
    }
    for (size_t s = b; s <= e; s *= f) {
      o->sizes.push_back(s);
    }
  }
  for (int i = optind; i < argc; i++) {
    size_t s;
    if (!parseSize(argv[i], &s)) {
      return false;
    }
    o->sizes.push_back(s);
  }
  o->algos = splitComma(algos);
  const std::vector<std::string> known = splitComma(kAllAlgos);
  for (const auto& a : o->algos) {
    if (std::find(known.begin(), known.end(), a) == known.end()) {
      fprintf(stderr, "unknown algorithm '%s'\n", a.c_str());
      return false;
    }
  }
  o->warmup = std::max(o->warmup, 1L);
  return o->size >= 1 && o->rank >= 0 && o->rank < o->size && !o->store.empty() &&
      !o->sizes.empty() && !o->algos.empty() && o->iters >= 0 && o->target > 0 &&
      o->timeoutSec > 0;
}

// One full mesh on its own device, rendezvous under `prefix` in the store.
struct Mesh {
  std::shared_ptr<gloo::transport::Device> dev;
  std::shared_ptr<gloo::rendezvous::Context> ctx;

  Mesh(gloo::rendezvous::Store& store, const std::string& prefix, const Options& o) {
    gloo::transport::tcp::attr attr;
    attr.hostname = "127.0.0.1";
    dev = gloo::transport::tcp::CreateDevice(attr);
    gloo::rendezvous::PrefixStore prefixed(prefix, store);
    ctx = std::make_shared<gloo::rendezvous::Context>(o.rank, o.size);
    ctx->setTimeout(std::chrono::seconds(o.timeoutSec));
    ctx->connectFullMesh(prefixed, dev);
  }
};

// Barrier, max and sum over ranks on the control mesh.
class Control {
 public:
  explicit Control(const std::shared_ptr<gloo::Context>& ctx)
      : barrier_(ctx),
        max_(ctx, {&maxVal_}, 1, gloo::ReductionFunction<double>::max),
        sum_(ctx, {&sumVal_}, 1, gloo::ReductionFunction<double>::sum) {}

  void barrier() { barrier_.run(); }
  double max(double v) { maxVal_ = v; max_.run(); return maxVal_; }
  double sum(double v) { sumVal_ = v; sum_.run(); return sumVal_; }

 private:
  double maxVal_ = 0;
  double sumVal_ = 0;
  gloo::BarrierAllToAll barrier_;
  gloo::AllreduceRing<double> max_;
  gloo::AllreduceRing<double> sum_;
};

// One algorithm bound to one size's buffers.
class Runner {
 public:
  virtual ~Runner() noexcept(false) {} // gloo::Algorithm's destructor may throw
  virtual void run() = 0;
  virtual bool inPlace() const = 0;
};

template <class Algo>
class LegacyRunner : public Runner {
 public:
  LegacyRunner(const std::shared_ptr<gloo::Context>& ctx, float* buf, size_t count)
      : algo_(ctx, std::vector<float*>{buf}, (int)count) {}
  void run() override { algo_.run(); }
  bool inPlace() const override { return true; }

 private:
  Algo algo_;
};

class NewApiRunner : public Runner {
 public:
  NewApiRunner(const std::shared_ptr<gloo::Context>& ctx,
               gloo::AllreduceOptions::Algorithm algorithm,
               float* in, float* out, size_t count)
      : opts_(ctx) {
    opts_.setAlgorithm(algorithm);
    opts_.setInput(in, count);
    opts_.setOutput(out, count);
    void (*fn)(void*, const void*, const void*, size_t) = &gloo::sum<float>;
    opts_.setReduceFunction(fn);
  }
  void run() override {
    // A fresh tag per op, as PyTorch's ProcessGroupGloo does.
    opts_.setTag(tag_++);
    gloo::allreduce(opts_);
  }
  bool inPlace() const override { return false; }

 private:
  gloo::AllreduceOptions opts_;
  uint32_t tag_ = 0;
};

std::unique_ptr<Runner> makeRunner(const std::string& algo,
                                   const std::shared_ptr<gloo::Context>& ctx,
                                   float* in, float* out, size_t count) {
  using Alg = gloo::AllreduceOptions::Algorithm;
  if (algo == "new_ring") {
    return std::unique_ptr<Runner>(new NewApiRunner(ctx, Alg::RING, in, out, count));
  }
  if (algo == "new_bcube") {
    return std::unique_ptr<Runner>(new NewApiRunner(ctx, Alg::BCUBE, in, out, count));
  }
  if (algo == "ring") {
    return std::unique_ptr<Runner>(new LegacyRunner<gloo::AllreduceRing<float>>(ctx, in, count));
  }
  if (algo == "ring_chunked") {
    return std::unique_ptr<Runner>(
        new LegacyRunner<gloo::AllreduceRingChunked<float>>(ctx, in, count));
  }
  if (algo == "halving_doubling") {
    return std::unique_ptr<Runner>(
        new LegacyRunner<gloo::AllreduceHalvingDoubling<float>>(ctx, in, count));
  }
  return std::unique_ptr<Runner>(new LegacyRunner<gloo::AllreduceBcube<float>>(ctx, in, count));
}

void fill(std::vector<float>& v, float x) {
  std::fill(v.begin(), v.end(), x);
}

// Counts wrong elements; reports the first one on stderr.
long countWrong(const std::vector<float>& v, float want, const Options& o,
                const std::string& algo, const char* when) {
  long wrong = 0;
  size_t first = 0;
  for (size_t i = 0; i < v.size(); i++) {
    if (v[i] != want && wrong++ == 0) {
      first = i;
    }
  }
  if (wrong) {
    fprintf(stderr, "rank %d: %s, %zu B, %s: %ld of %zu elements wrong, first [%zu] = %g, want %g\n",
            o.rank, algo.c_str(), v.size() * sizeof(float), when, wrong, v.size(), first,
            (double)v[first], (double)want);
  }
  return wrong;
}

void runOps(Runner& r, long n) {
  for (long i = 0; i < n; i++) {
    r.run();
  }
}

// Op count for about o.target seconds, the same on every rank.
long calibrate(Runner& r, Control& ctl, const Options& o) {
  if (o.iters > 0) {
    return o.iters;
  }
  long n = 1;
  double t;
  for (;;) {
    ctl.barrier();
    double t0 = now();
    runOps(r, n);
    t = ctl.max(now() - t0);
    if (t >= o.target / 8 || n >= (1L << 24)) {
      break;
    }
    n *= 2;
  }
  double want = o.target * (double)n / t;
  return want < kMinIters ? kMinIters : want > 1e8 ? 100000000L : (long)want;
}

// Runs every size on one algorithm; returns the total of wrong elements.
long benchAlgo(const std::string& algo, const std::shared_ptr<gloo::Context>& ctx,
               Control& ctl, const Options& o, std::string* itersLine) {
  const int N = o.size;
  const float want = (float)N * (float)(N + 1) / 2.0f;
  long wrongAll = 0;

  if (o.rank == 0) {
    printf("# algorithm: %s\n", algo.c_str());
    fflush(stdout);
  }
  for (size_t bytes : o.sizes) {
    const size_t count = bytes / sizeof(float);
    if (count == 0 || count > (size_t)INT32_MAX) {
      if (o.rank == 0) {
        printf("# skipped size %zu: count must be 1..INT_MAX floats\n", bytes);
      }
      continue;
    }
    std::vector<float> in(count, (float)(o.rank + 1));
    std::vector<float> out(count, 0.0f);
    std::unique_ptr<Runner> r = makeRunner(algo, ctx, in.data(), out.data(), count);
    std::vector<float>& result = r->inPlace() ? in : out;

    r->run();
    long wrong = countWrong(result, want, o, algo, "first op");
    runOps(*r, o.warmup - 1);
    const long n = calibrate(*r, ctl, o);

    fill(out, 0.0f);
    ctl.barrier();
    const double t0 = now();
    runOps(*r, n);
    const double local = now() - t0;
    if (r->inPlace()) {
      fill(in, (float)(o.rank + 1));
      r->run();
    }
    wrong += countWrong(result, want, o, algo, r->inPlace() ? "op after timing" : "last timed op");

    const double tmax = ctl.max(local);
    const long wrongTotal = (long)ctl.sum((double)wrong);
    wrongAll += wrongTotal;
    if (o.rank == 0) {
      const double us = tmax / (double)n * 1e6;
      const double algbw = (double)(count * sizeof(float)) / (us * 1e-6) / 1e9;
      const double busbw = algbw * 2.0 * (N - 1) / N;
      printf("%12zu %13zu %9s %6s %6d %11.2f %9.4f %9.4f %7ld\n", count * sizeof(float), count,
             "float", "sum", -1, us, algbw, busbw, wrongTotal);
      fflush(stdout);
      *itersLine += " " + std::to_string(bytes) + ":" + std::to_string(n);
    }
  }
  return wrongAll;
}

} // namespace

int main(int argc, char** argv) {
  Options o;
  if (!parseArgs(argc, argv, &o)) {
    usage(argv[0]);
    return 2;
  }
  if (mkdir(o.store.c_str(), 0700) != 0 && errno != EEXIST) {
    fprintf(stderr, "rank %d: mkdir %s: %s\n", o.rank, o.store.c_str(), strerror(errno));
    return 1;
  }

  long wrong = 0;
  try {
    gloo::rendezvous::FileStore store(o.store);
    Mesh control(store, "control", o);
    Control ctl(control.ctx);

    if (o.rank == 0) {
      printf("# gloo_allreduce: Gloo %d.%d.%d (libgloo), TCP on 127.0.0.1, float32 sum, np=%d\n",
             GLOO_VERSION_MAJOR, GLOO_VERSION_MINOR, GLOO_VERSION_PATCH, o.size);
      printf("# new_* = gloo::allreduce (out-of-place), others = legacy classes (in-place); "
             "one device and context per algorithm\n");
      printf("# time: max over ranks of the mean time per op, us; algbw = size/time; "
             "busbw = algbw*2(N-1)/N; GB/s = 1e9 B/s\n");
      if (o.iters > 0) {
        printf("# iters: %ld per size, warmup %ld\n", o.iters, o.warmup);
      } else {
        printf("# iters: sized to %.2f s per size (at least %ld), warmup %ld\n", o.target,
               kMinIters, o.warmup);
      }
      printf("#%11s %13s %9s %6s %6s %11s %9s %9s %7s\n", "size", "count", "type", "redop",
             "root", "time", "algbw", "busbw", "#wrong");
      printf("#%11s %13s %9s %6s %6s %11s %9s %9s %7s\n", "(B)", "(elements)", "", "", "",
             "(us)", "(GB/s)", "(GB/s)", "");
      fflush(stdout);
    }

    for (const auto& algo : o.algos) {
      Mesh mesh(store, "algo-" + algo, o);
      std::string itersLine;
      wrong += benchAlgo(algo, mesh.ctx, ctl, o, &itersLine);
      // Nobody tears down this mesh while a peer may still be using it.
      ctl.barrier();
      if (o.rank == 0) {
        printf("# timed ops per size:%s\n", itersLine.c_str());
      }
    }
    ctl.barrier();
  } catch (const std::exception& e) {
    fprintf(stderr, "rank %d: gloo error: %s\n", o.rank, e.what());
    return 1;
  }
  if (o.rank == 0) {
    printf("# %s\n", wrong ? "FAILED: wrong elements" : "all results verified");
  }
  return wrong ? 1 : 0;
}
