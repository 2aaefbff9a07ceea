#!/bin/sh
# Checks the Kubernetes examples (examples/k8s/*.yaml) without a cluster.
# Usage: tests/k8s/check.sh [BIN_DIR]
#
#  - yamllint --strict (Debian package yamllint), when it is installed;
#  - a structural check in python3 with its yaml module (python3-yaml):
#    every document has apiVersion, kind and metadata.name; every
#    container variable is one hvd reads (or a Kubernetes one the manifest
#    leaves to Kubernetes); every pod-mode worker's (HVD_POD=1)
#    HOROVOD_GLOO_RENDEZVOUS_ADDR names a Service of the examples whose
#    port is the worker's HOROVOD_GLOO_RENDEZVOUS_PORT and leads to an
#    hvd-rendezvous container listening on it, with its probes on GET
#    /_health; a Job's worker without HVD_POD=1 (hvd_init finds the
#    Indexed Job by itself, index 0 hosting the store) is an Indexed Job
#    with HOROVOD_SIZE = completions, one rank per pod, whose template's
#    subdomain names a headless Service of the examples that selects its
#    pods, publishes them before they are Ready and has the store's port
#    (29400, or HOROVOD_GLOO_RENDEZVOUS_PORT); store and workers use the
#    same Secret and key for the token; job sizes match HOROVOD_SIZE or the
#    store's --np; NetworkPolicies let the pods reach the store and each
#    other; docs/kubernetes.md creates that Secret and shows
#    examples/k8s/Dockerfile;
#  - with BIN_DIR (a build's bin/, e.g. build/bin): every workload's
#    commands are also run here, as its pods would run them: the store
#    with its manifest's arguments (port 0, on 127.0.0.1, the token in a
#    file), its health answered and a request without the token refused,
#    then one process per pod with the pod's environment, HOROVOD_HOSTNAME
#    set to the pod's host name (<name>-<index>) and the store's address
#    rewritten to 127.0.0.1. Every process must exit 0; in a static job pod
#    i must be rank i, hvd-bench's check and train_mlp's comparison must
#    pass; an elastic job must train all its pods' workers to the end; the
#    store must stop with 0 on SIGTERM. An Indexed Job without a store
#    runs the same way with JOB_COMPLETION_INDEX=i, index 0's name
#    replaced by 127.0.0.1 and its port by a free one; while one pod is
#    held back, index 0's store must answer its health, refuse a request
#    without the token and turn away a rank with another token; then the
#    last pod joins. Two changes for speed: in a `sh -c` script "sleep
#    infinity" (a StatefulSet's idle tail) becomes "kill -TERM $$", and a
#    --step-ms value becomes 0. The elastic run is left out when
#    hvd-rendezvous has no --min-np.
#
# Exit status: 0 when every check passes, 1 with a message per failure,
# 77 (skipped) when neither yamllint nor python3's yaml module is present.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${1:-}
if [ -n "$bin" ]; then
    bin=$(cd "$bin" 2>/dev/null && pwd) || { echo "k8s check: no directory $1" >&2; exit 1; }
fi
cd "$root" || exit 1

have_lint=0
have_yaml=0
command -v yamllint >/dev/null 2>&1 && have_lint=1
python3 -c 'import yaml' >/dev/null 2>&1 && have_yaml=1
if [ "$have_lint" = 0 ] && [ "$have_yaml" = 0 ]; then
    echo "skipped: neither yamllint nor python3's yaml module (Debian: yamllint, python3-yaml)"
    exit 77
fi

rc=0
if [ "$have_lint" = 1 ]; then
    if yamllint --strict -d '{extends: default, rules: {line-length: {max: 100}}}' \
        examples/k8s/*.yaml; then
        echo "k8s check: yamllint: ok"
    else
        echo "k8s check: yamllint found problems (above)" >&2
        rc=1
    fi
else
    echo "k8s check: yamllint not installed; lint skipped"
fi
if [ "$have_yaml" = 0 ]; then
    echo "k8s check: python3's yaml module missing; structural check skipped" >&2
    exit "$rc"
fi

python3 - "$root" "$bin" <<'EOF' || rc=1
import glob, json, os, re, signal, socket, subprocess, sys, tempfile, time, urllib.error
import urllib.request
import yaml

root, bin_dir = sys.argv[1], sys.argv[2]
errors = []


def fail(where, msg):
    errors.append(f"{where}: {msg}")


# hvd's variables: the names its sources read, and these in any case.
HVD_VARS = {
    "HVD_POD", "HVD_TOKEN", "HVD_PORT_RANGE", "HOROVOD_SIZE", "HOROVOD_RANK",
    "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE", "HOROVOD_HOSTNAME", "HOROVOD_ELASTIC",
    "HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT", "HOROVOD_GLOO_IFACE",
    "HOROVOD_GLOO_TIMEOUT_SECONDS", "HOROVOD_LOG_LEVEL", "HOROVOD_LOG_HIDE_TIME", "HVD_LAUNCHER",
}
for d in ("src", "launcher", "include", "examples", "bench"):
    for path in glob.glob(os.path.join(root, d, "**", "*.[ch]"), recursive=True):
        with open(path, errors="replace") as f:
            HVD_VARS.update(re.findall(r'"((?:HVD|HOROVOD|NCCL)_[A-Z0-9_]+)"', f.read()))
# Set by Kubernetes itself in an Indexed Job's pods (hvd_init reads it there:
# src/launch/k8s.c); a manifest leaves it to Kubernetes.
K8S_VARS = {"JOB_COMPLETION_INDEX"}
PROGRAMS = {"hvd-rendezvous", "hvd-bench", "train_mlp", "train_elastic"}
# The image's programs that call hvd_init, which finds an Indexed Job by
# itself (hvd-bench does only with -g, a GPU).
INIT_PROGRAMS = {"train_mlp"}
# Where index 0 of an Indexed Job hosts the store unless
# HOROVOD_GLOO_RENDEZVOUS_PORT says otherwise (src/launch/k8s.c).
K8S_STORE_PORT = 29400
STORE_FLAGS = {
    "--bind", "--port", "--token-file", "--plan", "--threads", "--max-connections",
    "--max-value-bytes", "--max-store-bytes", "--max-name-bytes", "--idle-timeout",
    "--log-level", "--min-np", "--np", "--max-np", "--elastic-timeout", "--pod-timeout",
    "--verbose",
}
STORE_SWITCHES = {"--verbose"}  # flags without a value
API = {"Service": "v1", "Secret": "v1", "Deployment": "apps/v1", "StatefulSet": "apps/v1",
       "Job": "batch/v1", "NetworkPolicy": "networking.k8s.io/v1"}
NAME = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
TRUE = {"1", "true", "yes", "on", "y"}


def as_int(v):
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, str) and re.fullmatch(r"[0-9]+", v.strip()):
        return int(v)
    return None


def matches(selector, labels):
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def parse_flags(argv, where):
    """hvd-rendezvous's flags as {flag: [values]} (--flag V and --flag=V)."""
    flags, i = {}, 1
    while i < len(argv):
        a = argv[i]
        if not a.startswith("--"):
            fail(where, f"hvd-rendezvous takes no argument '{a}'")
            i += 1
            continue
        name, eq, value = a.partition("=")
        if name not in STORE_FLAGS:
            fail(where, f"hvd-rendezvous has no flag {name}")
        if name in STORE_SWITCHES:
            if eq:
                fail(where, f"{name} takes no value")
            flags.setdefault(name, [])
            i += 1
            continue
        if not eq:
            if i + 1 >= len(argv):
                fail(where, f"{name} needs a value")
                break
            value = argv[i + 1]
            i += 1
        flags.setdefault(name, []).append(str(value))
        i += 1
    return flags


# ---- load ----------------------------------------------------------------
objects = []  # dicts with file, where, doc
files = sorted(glob.glob(os.path.join(root, "examples", "k8s", "*.yaml")))
if not files:
    fail("examples/k8s", "no *.yaml files")
for path in files:
    rel = os.path.relpath(path, root)
    try:
        with open(path) as f:
            loaded = list(yaml.safe_load_all(f))
    except yaml.YAMLError as e:
        fail(rel, f"not valid YAML: {e}")
        continue
    for i, doc in enumerate(loaded):
        if doc is None:
            continue
        where = f"{rel} document {i + 1}"
        if not isinstance(doc, dict):
            fail(where, "is not a mapping")
            continue
        meta = doc.get("metadata")
        name = meta.get("name") if isinstance(meta, dict) else None
        for key, value in (("apiVersion", doc.get("apiVersion")), ("kind", doc.get("kind")),
                           ("metadata.name", name)):
            if not isinstance(value, str) or not value:
                fail(where, f"has no {key}")
        if not isinstance(name, str) or not isinstance(doc.get("kind"), str):
            continue
        where = f"{rel} {doc['kind']}/{name}"
        if not NAME.match(name) or len(name) > 63:
            fail(where, "the name is not a DNS label (lower case, digits, '-', at most 63)")
        if doc["kind"] not in API:
            known = ", ".join(sorted(API))
            fail(where, f"kind {doc['kind']} is not one this check knows ({known})")
        elif doc["apiVersion"] != API[doc["kind"]]:
            fail(where, f"apiVersion {doc['apiVersion']}, expected {API[doc['kind']]}")
        if any(o["doc"]["kind"] == doc["kind"] and o["name"] == name for o in objects):
            fail(where, "defined twice")
        objects.append({"file": rel, "where": where, "doc": doc, "name": name})

# ---- pod templates and containers ----------------------------------------
pods = []  # workload, its template's labels and spec
for o in objects:
    doc, where = o["doc"], o["where"]
    if doc["kind"] not in ("Deployment", "StatefulSet", "Job"):
        continue
    spec = doc.get("spec") or {}
    tmpl = spec.get("template") or {}
    labels = (tmpl.get("metadata") or {}).get("labels") or {}
    pspec = tmpl.get("spec") or {}
    if doc["kind"] != "Job":
        sel = (spec.get("selector") or {}).get("matchLabels") or {}
        if not matches(sel, labels):
            fail(where, "spec.selector.matchLabels does not match the pod template's labels")
    containers = pspec.get("containers")
    if not isinstance(containers, list) or not containers:
        fail(where, "has no containers")
        continue
    pods.append({"o": o, "labels": labels, "spec": pspec, "kind": doc["kind"], "spec_": spec})
    for c in containers:
        cw = f"{where} container {c.get('name')}"
        if not c.get("name") or not c.get("image"):
            fail(cw, "needs a name and an image")
        req = (c.get("resources") or {}).get("requests") or {}
        if "cpu" not in req or "memory" not in req:
            fail(cw, "set resources.requests (cpu and memory)")
        for e in c.get("env") or []:
            n = e.get("name")
            if not isinstance(n, str):
                fail(cw, "an env entry has no name")
                continue
            if ("value" in e) == ("valueFrom" in e):
                fail(cw, f"env {n}: give exactly one of value and valueFrom")
            if "value" in e and not isinstance(e["value"], str):
                fail(cw, f"env {n}: the value {e['value']!r} must be a string (quote it)")
            if re.match(r"(HVD|HOROVOD|NCCL)_", n):
                if n not in HVD_VARS:
                    fail(cw, f"env {n} is not a variable hvd reads (docs/environment.md)")
            elif n in K8S_VARS:
                fail(cw, f"env {n}: Kubernetes sets it in an Indexed Job's pods; leave it out")
            else:
                fail(cw, f"env {n} is neither hvd's nor a Kubernetes one")
images = {c.get("image") for p in pods for c in p["spec"]["containers"]}
if len(images) > 1:
    fail("examples/k8s", f"the examples use different images: {sorted(map(str, images))}")


def argv_of(c):
    return [str(x) for x in (c.get("command") or []) + (c.get("args") or [])]


def container_port(c, port):
    """A probe's or targetPort's port (number or name) as a number."""
    for p in c.get("ports") or []:
        if port == p.get("name") or as_int(port) == p.get("containerPort"):
            return p.get("containerPort")
    return None


# ---- stores ----------------------------------------------------------------
stores = []
for p in pods:
    for c in p["spec"]["containers"]:
        argv = argv_of(c)
        if not argv or os.path.basename(argv[0]) != "hvd-rendezvous":
            continue
        where = f"{p['o']['where']} container {c.get('name')}"
        flags = parse_flags(argv, where)
        s = {"p": p, "c": c, "where": where, "flags": flags, "argv": argv, "secret": None}
        stores.append(s)
        spec = p["spec_"]
        if p["kind"] != "Deployment":
            fail(where, "run the store as a Deployment")
        if spec.get("replicas") != 1:
            fail(where, "replicas must be 1: the store's data is in its memory")
        if (spec.get("strategy") or {}).get("type") != "Recreate":
            fail(where, "strategy.type must be Recreate: a rolling update runs two stores")
        port = as_int((flags.get("--port") or [None])[-1])
        s["port"] = port
        if port is None or port == 0:
            fail(where, "give hvd-rendezvous a fixed --port")
        elif container_port(c, port) != port:
            fail(where, f"no containerPort {port} (--port)")
        for probe in ("readinessProbe", "livenessProbe"):
            get = (c.get(probe) or {}).get("httpGet")
            if not get:
                fail(where, f"{probe}: use httpGet on /_health")
                continue
            if get.get("path") != "/_health":
                fail(where, f"{probe}: path {get.get('path')}, expected /_health")
            if container_port(c, get.get("port")) != port:
                fail(where, f"{probe}: port {get.get('port')} is not --port {port}")
        env = {e.get("name"): e for e in c.get("env") or []}
        token_file = (flags.get("--token-file") or [None])[-1]
        if token_file:
            for m in c.get("volumeMounts") or []:
                mp = m.get("mountPath", "").rstrip("/")
                if not token_file.startswith(mp + "/"):
                    continue
                rel = token_file[len(mp) + 1:]
                vol = next((v for v in p["spec"].get("volumes") or []
                            if v.get("name") == m.get("name")), None)
                sec = (vol or {}).get("secret")
                if not sec:
                    fail(where, f"--token-file {token_file} is not in a Secret volume")
                    break
                key = rel
                for item in sec.get("items") or []:
                    if item.get("path") == rel:
                        key = item.get("key")
                s["secret"] = (sec.get("secretName"), key)
                break
            else:
                fail(where, f"--token-file {token_file} is on no volumeMount")
        elif "HVD_TOKEN" in env:
            ref = (env["HVD_TOKEN"].get("valueFrom") or {}).get("secretKeyRef") or {}
            s["secret"] = (ref.get("name"), ref.get("key")) if ref else None
        if s["secret"] is None:
            fail(where, "the store has no token from a Secret (--token-file)")
        el = {f: as_int(flags[f][-1]) for f in ("--min-np", "--np", "--max-np") if f in flags}
        if any(v is None for v in el.values()):
            fail(where, "--min-np, --np and --max-np take whole numbers")
        elif el:
            if "--min-np" not in el:
                fail(where, "--np and --max-np need --min-np (the elastic driver)")
            lo = el.get("--min-np", 1)
            np_ = el.get("--np", lo)
            hi = el.get("--max-np", max(np_, lo))
            if not 1 <= lo <= np_ <= hi:
                fail(where, f"needs 1 <= --min-np ({lo}) <= --np ({np_}) <= --max-np ({hi})")
            s["np"] = np_
        s["elastic"] = "--min-np" in flags

# ---- services -------------------------------------------------------------
services = {}
for o in objects:
    if o["doc"]["kind"] != "Service":
        continue
    spec, where = o["doc"].get("spec") or {}, o["where"]
    sel = spec.get("selector") or {}
    selected = [p for p in pods if matches(sel, p["labels"])]
    # Headless: no address of its own, only DNS names for the pods it
    # selects; here, an Indexed Job's, so that its pods find index 0's.
    headless = spec.get("clusterIP") == "None"
    if spec.get("type", "ClusterIP") != "ClusterIP" or \
            (headless and any(s["p"] in selected for s in stores)):
        fail(where, "the store's Service should be a plain ClusterIP Service")
    elif headless:
        for p in selected:
            if p["kind"] != "Job" or p["spec_"].get("completionMode") != "Indexed":
                fail(where, f"a headless Service here names an Indexed Job's pods, not those of "
                            f"{p['o']['where']}")
        if spec.get("publishNotReadyAddresses") is not True:
            fail(where, "set publishNotReadyAddresses: true: pods look index 0's name up as they "
                        "start, before they are Ready")
    if not selected:
        fail(where, f"its selector {sel} matches no pod template in the examples")
    ports = {}
    for sp in spec.get("ports") or []:
        port = sp.get("port")
        target = sp.get("targetPort", port)
        ports[port] = target
        for s in stores:
            if s["p"] in selected and container_port(s["c"], target) != s["port"]:
                fail(where, f"port {port} forwards to {target}, not the store's --port {s['port']}")
    store = [s for s in stores if s["p"] in selected]
    services[o["name"]] = {"o": o, "ports": ports, "store": store[0] if store else None,
                           "headless": headless, "selector": sel}
for s in stores:
    if not any(v["store"] is s for v in services.values()):
        fail(s["where"], "no Service selects this store")

# ---- network policies -----------------------------------------------------
policies = [o for o in objects if o["doc"]["kind"] == "NetworkPolicy"]


def from_pod(peer, labels):
    """Whether a rule's `from` entry admits a pod of these labels (this namespace)."""
    if "namespaceSelector" in peer or "ipBlock" in peer or "podSelector" not in peer:
        return False
    sel = peer["podSelector"] or {}
    if "matchExpressions" in sel:
        fail("examples/k8s", "this check reads matchLabels only")
    return all(labels.get(k) == v for k, v in (sel.get("matchLabels") or {}).items())


def allowed(target_labels, source_labels, lo, hi):
    """Whether the policies selecting the target let the source reach ports lo..hi."""
    ranges, chosen = [], False
    for o in policies:
        spec = o["doc"].get("spec") or {}
        sel = spec.get("podSelector") or {}
        if "matchExpressions" in sel:
            fail(o["where"], "this check reads matchLabels only")
        if not all(target_labels.get(k) == v for k, v in (sel.get("matchLabels") or {}).items()):
            continue
        if "Ingress" not in (spec.get("policyTypes") or ["Ingress"]):
            continue
        chosen = True
        for rule in spec.get("ingress") or []:
            if "from" in rule and not any(from_pod(f, source_labels) for f in rule["from"]):
                continue
            if not rule.get("ports"):
                return True
            for rp in rule["ports"]:
                start = as_int(rp.get("port"))
                if rp.get("protocol", "TCP") == "TCP" and start is not None:
                    ranges.append((start, as_int(rp.get("endPort")) or start))
    if not chosen:
        return True
    return all(any(a <= port <= b for a, b in ranges) for port in range(lo, hi + 1))


# ---- workers ----------------------------------------------------------------
workers = []
secrets = set()


def indexed_worker(p, c, env):
    """A Job's container without HVD_POD=1: hvd_init finds the job from the
    Indexed Job's variables, and index 0 hosts the store (src/launch/k8s.c)."""
    o, spec, pspec = p["o"], p["spec_"], p["spec"]
    where = f"{o['where']} container {c.get('name')}"
    val = lambda n: (env.get(n) or {}).get("value")  # noqa: E731
    text = " ".join(argv_of(c))
    progs = [w for w in PROGRAMS if re.search(rf"(^|[\s/]){re.escape(w)}(\s|$)", text)]
    if not any(w in INIT_PROGRAMS for w in progs):
        fail(where, f"runs none of the image's programs that call hvd_init "
                    f"({', '.join(sorted(INIT_PROGRAMS))}); a pod-mode worker sets HVD_POD=1")
    count = spec.get("parallelism")
    if spec.get("completionMode") != "Indexed":
        fail(where, "without HVD_POD=1 the rank is the pod's JOB_COMPLETION_INDEX: use an "
                    "Indexed Job (completionMode: Indexed)")
    if spec.get("completions") != count:
        fail(where, f"parallelism ({count}) and completions ({spec.get('completions')}) must "
                    "be equal")
    if pspec.get("restartPolicy") not in ("Never", "OnFailure"):
        fail(where, "a Job's restartPolicy is Never or OnFailure")
    if spec.get("backoffLimit") != 0:
        fail(where, "backoffLimit must be 0: a retried index 0 would host a new, empty store")
    size = as_int(val("HOROVOD_SIZE"))
    if size is None:
        fail(where, "set HOROVOD_SIZE to the Job's completions (a whole number): Kubernetes "
                    "does not tell a pod")
    elif isinstance(count, int) and size != count:
        fail(where, f"HOROVOD_SIZE={size} but the Job has {count} completions, one rank each")
    # hvdrun's variables would win over the Indexed Job's (src/launch/detect.c).
    if "HOROVOD_RANK" in env or str(val("HOROVOD_ELASTIC") or "").strip().lower() in TRUE:
        fail(where, "HOROVOD_RANK or HOROVOD_ELASTIC=1 makes hvd ignore JOB_COMPLETION_INDEX")
    for n in ("HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE"):
        if n in env:
            fail(where, f"{n}: the rank is the pod's index, so one rank per pod")
    if val("HVD_LAUNCHER") not in (None, "k8s"):
        fail(where, f"HVD_LAUNCHER={val('HVD_LAUNCHER')}: an Indexed Job's is k8s")
    # Across pods there is no MUNGE: a rank without the token could not be
    # admitted, so every pod carries it.
    ref = ((env.get("HVD_TOKEN") or {}).get("valueFrom") or {}).get("secretKeyRef") or {}
    if not ref:
        fail(where, "HVD_TOKEN must come from a Secret (valueFrom.secretKeyRef) in every pod")
    else:
        secrets.add((ref.get("name"), ref.get("key")))
    # The others derive index 0's name, <job>-0.<subdomain>..., from their
    # own, which only a headless Service gives them.
    sub = pspec.get("subdomain")
    svc = services.get(sub) if isinstance(sub, str) else None
    port = K8S_STORE_PORT
    if "HOROVOD_GLOO_RENDEZVOUS_PORT" in env:
        port = as_int(val("HOROVOD_GLOO_RENDEZVOUS_PORT"))
        if port is None or not 1 <= port <= 65535:
            fail(where, f"HOROVOD_GLOO_RENDEZVOUS_PORT={val('HOROVOD_GLOO_RENDEZVOUS_PORT')} "
                        "is not a port")
    if svc is None or not svc["headless"]:
        known = ", ".join(sorted(n for n, v in services.items() if v["headless"])) or "none"
        fail(where, f"the pod template's subdomain ({sub}) must name a headless Service of the "
                    f"examples ({known}): index 0's DNS name comes from it")
    else:
        if not matches(svc["selector"], p["labels"]):
            fail(where, f"Service {sub} does not select these pods: they would have no DNS names")
        if port is not None and port not in svc["ports"]:
            fail(where, f"index 0's store listens on {port}, not a port of Service {sub} "
                        f"({sorted(svc['ports'])})")
        elif port is not None and as_int(svc["ports"][port]) != port:
            fail(where, f"Service {sub} forwards port {port} to {svc['ports'][port]}, but index 0 "
                        f"listens on {port} itself")
    addr = val("HOROVOD_GLOO_RENDEZVOUS_ADDR")
    if addr is not None and not (addr + ".").startswith(f"{o['name']}-0.{sub}."):
        fail(where, f"HOROVOD_GLOO_RENDEZVOUS_ADDR={addr} is not index 0 ({o['name']}-0.{sub}): "
                    "leave it out, and the pods derive it")
    pr = val("HVD_PORT_RANGE")
    m = re.fullmatch(r"\s*([0-9]+)\s*(?:-\s*([0-9]+))?\s*", pr or "")
    if pr is not None and (not m or not 1 <= int(m[1]) <= int(m[2] or m[1]) <= 65535):
        fail(where, f"HVD_PORT_RANGE={pr} is not A or A-B within 1..65535")
        m = None
    if m and port is not None and int(m[1]) <= port <= int(m[2] or m[1]):
        fail(where, f"index 0's store port {port} is inside HVD_PORT_RANGE={pr}, the ranks'")
    if policies:
        if port is not None and not allowed(p["labels"], p["labels"], port, port):
            fail(where, f"a NetworkPolicy keeps these pods from index 0's store port {port}")
        if pr is None:
            fail(where, "a NetworkPolicy selects hvd's pods: set HVD_PORT_RANGE")
        elif m and not allowed(p["labels"], p["labels"], int(m[1]), int(m[2] or m[1])):
            fail(where, f"a NetworkPolicy does not open HVD_PORT_RANGE={pr} between these pods")
    workers.append({"p": p, "c": c, "env": env, "where": where, "store": None, "count": count,
                    "elastic": False, "per_pod": 1, "progs": progs, "indexed": True,
                    "store_port": port})


for p in pods:
    for c in p["spec"]["containers"]:
        env = {e.get("name"): e for e in c.get("env") or []}
        if str((env.get("HVD_POD") or {}).get("value", "")).strip().lower() not in TRUE:
            argv = argv_of(c)
            if p["kind"] == "Job" and not (argv and os.path.basename(argv[0]) == "hvd-rendezvous"):
                indexed_worker(p, c, env)
            continue
        where = f"{p['o']['where']} container {c.get('name')}"
        val = lambda n: (env.get(n) or {}).get("value")  # noqa: E731
        argv = argv_of(c)
        text = " ".join(argv)
        progs = [w for w in PROGRAMS if re.search(rf"(^|[\s/]){re.escape(w)}(\s|$)", text)]
        if not progs:
            fail(where, f"runs none of the image's programs ({', '.join(sorted(PROGRAMS))})")
        addr = val("HOROVOD_GLOO_RENDEZVOUS_ADDR")
        port = as_int(val("HOROVOD_GLOO_RENDEZVOUS_PORT"))
        svc = services.get((addr or "").split(".")[0])
        store = svc["store"] if svc else None
        if svc is None:
            fail(where, f"HOROVOD_GLOO_RENDEZVOUS_ADDR={addr} is not a Service of the examples "
                        f"({', '.join(sorted(services)) or 'none'})")
        elif port not in svc["ports"]:
            fail(where, f"HOROVOD_GLOO_RENDEZVOUS_PORT={val('HOROVOD_GLOO_RENDEZVOUS_PORT')} is "
                        f"not a port of Service {svc['o']['name']} ({sorted(svc['ports'])})")
        tok = env.get("HVD_TOKEN") or {}
        ref = (tok.get("valueFrom") or {}).get("secretKeyRef") or {}
        if not ref:
            fail(where, "HVD_TOKEN must come from a Secret (valueFrom.secretKeyRef)")
        else:
            secrets.add((ref.get("name"), ref.get("key")))
            if store and store["secret"] and store["secret"] != (ref.get("name"), ref.get("key")):
                fail(where, f"HVD_TOKEN is Secret {ref.get('name')} key {ref.get('key')}, the "
                            f"store's is {store['secret'][0]} key {store['secret'][1]}")
        if store and store["secret"]:
            secrets.add(store["secret"])
        if "HOROVOD_RANK" in env:
            fail(where, "HVD_POD=1 takes the rank from the store: do not set HOROVOD_RANK")
        if "HOROVOD_LOCAL_RANK" in env and "HOROVOD_LOCAL_SIZE" not in env:
            fail(where, "HOROVOD_LOCAL_RANK needs HOROVOD_LOCAL_SIZE (hvd takes both)")
        spec = p["spec_"]
        if p["kind"] == "Job":
            count = spec.get("parallelism")
            if spec.get("completionMode") != "Indexed":
                fail(where, "use an Indexed Job (completionMode: Indexed): pod host names "
                            "<job>-<index> give the rank order")
            if spec.get("completions") != count:
                fail(where, f"parallelism ({count}) and completions "
                            f"({spec.get('completions')}) must be equal")
            if p["spec"].get("restartPolicy") not in ("Never", "OnFailure"):
                fail(where, "a Job's restartPolicy is Never or OnFailure")
        elif p["kind"] == "StatefulSet":
            count = spec.get("replicas")
        else:
            count = None
            fail(where, "run workers as an Indexed Job or a StatefulSet")
        elastic = str(val("HOROVOD_ELASTIC") or "").strip().lower() in TRUE
        per_pod = as_int(val("HOROVOD_LOCAL_SIZE")) or 1
        if elastic:
            if "HOROVOD_SIZE" in env:
                fail(where, "an elastic pod job takes its size from the driver: no HOROVOD_SIZE")
            if store and not store["elastic"]:
                fail(where, f"HOROVOD_ELASTIC=1 but the store behind {addr} has no --min-np")
            if store and store["elastic"] and isinstance(count, int) and \
                    count * per_pod < store.get("np", 1):
                fail(where, f"{count} pods cannot reach the store's --np {store.get('np')}")
            if p["kind"] != "Job":
                fail(where, "run an elastic job as an Indexed Job")
            if "train_elastic" not in progs:
                fail(where, "an elastic worker runs a program of the elastic API (train_elastic)")
        else:
            size = as_int(val("HOROVOD_SIZE"))
            if size is None:
                fail(where, "HVD_POD=1 needs HOROVOD_SIZE (a whole number)")
            elif isinstance(count, int) and size != count * per_pod:
                fail(where, f"HOROVOD_SIZE={size} but {count} pods x {per_pod} ranks")
            if store and store["elastic"]:
                fail(where, f"a static job (no HOROVOD_ELASTIC) against the elastic store {addr}")
            if p["kind"] == "Job" and spec.get("backoffLimit") != 0:
                fail(where, "backoffLimit must be 0: a retried static job meets the old records")
        pr = val("HVD_PORT_RANGE")
        m = re.fullmatch(r"\s*([0-9]+)\s*(?:-\s*([0-9]+))?\s*", pr or "")
        if pr is not None and (not m or not 1 <= int(m[1]) <= int(m[2] or m[1]) <= 65535):
            fail(where, f"HVD_PORT_RANGE={pr} is not A or A-B within 1..65535")
            m = None
        if policies:
            if store and not allowed(store["p"]["labels"], p["labels"], store["port"],
                                     store["port"]):
                fail(where, "a NetworkPolicy keeps these pods from the store's port "
                            f"{store['port']}")
            if pr is None:
                fail(where, "a NetworkPolicy selects hvd's pods: set HVD_PORT_RANGE")
            elif m and not allowed(p["labels"], p["labels"], int(m[1]), int(m[2] or m[1])):
                fail(where, f"a NetworkPolicy does not open HVD_PORT_RANGE={pr} between these pods")
        workers.append({"p": p, "c": c, "env": env, "where": where, "store": store,
                        "count": count, "elastic": elastic, "per_pod": per_pod, "progs": progs})
if not workers:
    fail("examples/k8s", "no worker (a container with HVD_POD=1, or of an Indexed Job)")

# ---- the page --------------------------------------------------------------
page_path = os.path.join(root, "docs", "kubernetes.md")
if not os.path.exists(page_path):
    fail("docs/kubernetes.md", "missing")
else:
    with open(page_path) as f:
        page = f.read()
    for name, key in sorted(s for s in secrets if s[0]):
        if f"secret generic {name}" not in page or f"--from-literal={key}=" not in page:
            fail("docs/kubernetes.md", f"does not create Secret {name} with key {key}")
    dockerfile = os.path.join(root, "examples", "k8s", "Dockerfile")
    block = re.search(r"```dockerfile\n(.*?)```", page, re.S)
    if os.path.exists(dockerfile):
        with open(dockerfile) as f:
            if not block or block[1].strip() != f.read().strip():
                fail("docs/kubernetes.md",
                     "its dockerfile block differs from examples/k8s/Dockerfile")

if errors:
    for e in errors:
        print(f"k8s check: FAIL {e}", file=sys.stderr)
    sys.exit(1)
print(f"k8s check: structure ok ({len(objects)} objects in {len(files)} files, "
      f"{len(stores)} stores, {len(workers)} workers)")
if not bin_dir:
    sys.exit(0)


# ---- run the static workloads here ------------------------------------------
def start_store(s, token_path, log_path):
    argv = [os.path.join(bin_dir, "hvd-rendezvous"), "--bind", "127.0.0.1"]
    it = iter(s["argv"][1:])
    for a in it:
        name, eq, value = a.partition("=")
        if name in STORE_SWITCHES:
            argv.append(name)
            continue
        if not eq and name in STORE_FLAGS:
            value = next(it)
        if name == "--port":
            value = "0"
        elif name == "--token-file":
            value = token_path
        elif name == "--bind":
            continue
        argv += [name, value]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env={"PATH": os.environ["PATH"]})
    deadline = time.monotonic() + 10
    while True:
        with open(log_path) as f:
            text = f.read()
        m = re.search(r"listening on .*:([0-9]+)\n", text)
        if m:
            return proc, int(m[1])
        if proc.poll() is not None or time.monotonic() > deadline:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            raise RuntimeError(f"{' '.join(argv)}: no 'listening on' line, got {text!r}")
        time.sleep(0.05)


def get(url, token=None):
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""


def run(w, work):
    c, o = w["c"], w["p"]["o"]
    label = f"{o['file']} {o['name']}"
    token = "k8s-check-" + os.urandom(8).hex()
    token_path = os.path.join(work, "token")
    with open(token_path, "w") as f:
        f.write(token + "\n")
    store_log = os.path.join(work, "store")
    store, port = start_store(w["store"], token_path, store_log)
    procs, logs = [], []
    try:
        status, body = get(f"http://127.0.0.1:{port}/_health")
        health = json.loads(body) if status == 200 else {}
        if health.get("status") != "ok" or health.get("token_required") is not True:
            return f"{label}: GET /_health answered {status} {body!r}"
        if get(f"http://127.0.0.1:{port}/pods")[0] != 401:
            return f"{label}: the store answered GET /pods without the token"
        argv = argv_of(c)
        if argv and argv[0] == "sh" and "-c" in argv:
            i = argv.index("-c") + 1
            argv[i] = argv[i].replace("sleep infinity", "kill -TERM $$")
        if "--step-ms" in argv[:-1]:
            argv[argv.index("--step-ms") + 1] = "0"
        n = w["count"]
        # Started last to first: the ranks must still follow the pod names.
        for i in reversed(range(n)):
            env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
            for name, e in w["env"].items():
                if "value" in e:
                    env[name] = e["value"]
                elif "secretKeyRef" in (e.get("valueFrom") or {}):
                    env[name] = token
            env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] = "127.0.0.1"
            env["HOROVOD_GLOO_RENDEZVOUS_PORT"] = str(port)
            env["HOROVOD_HOSTNAME"] = f"{o['name']}-{i}"
            log = open(os.path.join(work, f"pod-{i}"), "w+")
            logs.insert(0, log)
            procs.insert(0, subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, cwd=work,
                                             start_new_session=True))
        deadline = time.monotonic() + 240
        for i, proc in enumerate(procs):
            try:
                rc = proc.wait(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return f"{label}: pod {i} still running after 240 s"
            logs[i].seek(0)
            if rc != 0:
                with open(store_log) as f:
                    tail = f.read()[-1000:]
                return f"{label}: pod {i} exited with {rc}:\n{logs[i].read()[-3000:]}" \
                       f"\nthe store's output:\n{tail}"
        out = []
        for log in logs:
            log.seek(0)
            out.append(log.read())
        k, ranks = w["per_pod"], "ranks not logged"
        if w["elastic"]:
            done = [t for t in out if "done:" in t and "parameters identical on every rank" in t]
            if not done or not any(f"start: {n * k} workers" in t for t in out):
                return f"{label}: the elastic job did not run {n * k} workers to the end:\n" \
                       f"{out[0][-3000:]}"
            ranks = f"{n * k} workers trained to the end"
        elif str(w["env"].get("HOROVOD_LOG_LEVEL", {}).get("value", "")).lower() in \
                ("info", "debug", "trace"):
            for i, text in enumerate(out):
                for lr in range(k):
                    who = f"{o['name']}-{i}" + (f":{lr}" if k > 1 else "")
                    if f"'{who}' is rank {i * k + lr} of {n * k}" not in text:
                        return f"{label}: {who} is not rank {i * k + lr}:\n{text[-3000:]}"
            ranks = "ranks in pod order"
        if "hvd-bench" in w["progs"] and "Out of bounds values : 0 OK" not in out[0]:
            return f"{label}: hvd-bench's check failed:\n{out[0][-3000:]}"
        if "train_mlp" in w["progs"] and not any("parameters identical on all" in t for t in out):
            return f"{label}: train_mlp's ranks did not end identical:\n{out[0][-3000:]}"
        store.send_signal(signal.SIGTERM)
        try:
            rc = store.wait(timeout=10)
        except subprocess.TimeoutExpired:
            return f"{label}: the store did not stop within 10 s of SIGTERM"
        if rc != 0:
            return f"{label}: the store exited with {rc} on SIGTERM"
        print(f"k8s check: ran {label}: store on port {port}, {n} pods x {k} ranks, "
              f"{ranks}, every process exited 0")
        return None
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if store.poll() is None:
            store.kill()
            store.wait()
        for log in logs:
            log.close()


def free_port(avoid):
    """A port no process here listens on now, outside the ranks' range avoid."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if not avoid[0] <= port <= avoid[1]:
            return port


def run_indexed(w, work):
    """An Indexed Job without a store: its pods as processes, index 0 hosting
    the store in its own process."""
    c, o, n = w["c"], w["p"]["o"], w["count"]
    label = f"{o['file']} {o['name']}"
    token = "k8s-check-" + os.urandom(8).hex()
    m = re.fullmatch(r"\s*([0-9]+)\s*(?:-\s*([0-9]+))?\s*",
                     str(w["env"].get("HVD_PORT_RANGE", {}).get("value", "")))
    port = free_port((int(m[1]), int(m[2] or m[1])) if m else (0, -1))
    argv = argv_of(c)
    procs, logs = {}, {}

    def pod_env(i, tok):
        env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
        for name, e in w["env"].items():
            if "value" in e:
                env[name] = e["value"]
            elif "secretKeyRef" in (e.get("valueFrom") or {}):
                env[name] = tok
        # What Kubernetes sets in pod i of an Indexed Job.
        env["JOB_COMPLETION_INDEX"] = str(i)
        # There is no DNS here for <job>-0.<subdomain>...: 127.0.0.1 stands
        # in for index 0's name, and a free port for its store's, which
        # another program here may hold.
        env["HOROVOD_GLOO_RENDEZVOUS_ADDR"] = "127.0.0.1"
        env["HOROVOD_GLOO_RENDEZVOUS_PORT"] = str(port)
        env["HOROVOD_HOSTNAME"] = f"{o['name']}-{i}"
        return env

    def start(i):
        logs[i] = open(os.path.join(work, f"pod-{i}"), "w+")
        procs[i] = subprocess.Popen(argv, env=pod_env(i, token), stdout=logs[i],
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=work,
                                    start_new_session=True)

    def output(i):
        logs[i].seek(0)
        return logs[i].read()

    try:
        # Last to first, index 0 last: the others wait for its store. The
        # last index is held back until the store has been probed.
        held = n - 1
        for i in reversed(range(n)):
            if i != held or n == 1:
                start(i)
        deadline = time.monotonic() + 30
        while True:
            try:
                status, body = get(f"http://127.0.0.1:{port}/_health")
            except OSError:  # not listening yet
                status, body = 0, ""
            if status == 200:
                break
            if procs[0].poll() is not None or time.monotonic() > deadline:
                return f"{label}: index 0 hosts no store on port {port}:\n{output(0)[-3000:]}"
            time.sleep(0.05)
        health = json.loads(body)
        if health.get("status") != "ok" or health.get("token_required") is not True:
            return f"{label}: index 0's GET /_health answered {body!r}"
        if n > 1:
            if get(f"http://127.0.0.1:{port}/global")[0] != 401:
                return f"{label}: index 0's store answered GET /global without the token"
            # A pod of the held index whose Secret differs must be turned
            # away, without harm to the job.
            env = pod_env(held, "k8s-check-other-" + os.urandom(8).hex())
            env["HOROVOD_GLOO_TIMEOUT_SECONDS"] = "10"
            try:
                other = subprocess.run(argv, env=env, stdout=subprocess.PIPE,
                                       stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       cwd=work, text=True, timeout=60)
            except subprocess.TimeoutExpired:
                return f"{label}: a pod with another token still ran after 60 s"
            if other.returncode == 0 or "the job token was rejected" not in other.stdout:
                return f"{label}: a pod with another token was not turned away " \
                       f"(exit {other.returncode}):\n{other.stdout[-3000:]}"
            start(held)
        deadline = time.monotonic() + 240
        for i in range(n):
            try:
                rc = procs[i].wait(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                return f"{label}: pod {i} still running after 240 s"
            if rc != 0:
                return f"{label}: pod {i} exited with {rc}:\n{output(i)[-3000:]}"
        out = [output(i) for i in range(n)]
        ranks = "ranks not logged"
        if str(w["env"].get("HOROVOD_LOG_LEVEL", {}).get("value", "")).lower() in \
                ("info", "debug", "trace"):
            said = ("launcher: k8s (", f"hosts the store at 127.0.0.1:{port}")
            if n > 1 and not all(x in out[0] for x in said):
                return f"{label}: index 0 did not say that it hosts the store:\n{out[0][-3000:]}"
            # Every log line names its rank: "[<time>: I rank 2 file.c:10] ".
            for i, text in enumerate(out):
                got = set(re.findall(r"[A-Z] rank ([0-9]+) [^ \]]+:[0-9]+\] ", text))
                if got != {str(i)}:
                    return f"{label}: pod {i} logged as rank {sorted(got) or 'none'}, not " \
                           f"{i}:\n{text[-3000:]}"
            ranks = "rank = index, index 0 hosting the store"
        if "train_mlp" in w["progs"] and not any("parameters identical on all" in t for t in out):
            return f"{label}: train_mlp's ranks did not end identical:\n{out[0][-3000:]}"
        print(f"k8s check: ran {label}: no store Deployment, {n} pods x 1 rank, {ranks} "
              f"(port {port}), another token turned away, every process exited 0")
        return None
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for log in logs.values():
            log.close()


help_text = subprocess.run([os.path.join(bin_dir, "hvd-rendezvous"), "--help"],
                           capture_output=True, text=True).stdout
failed = False
for w in workers:
    label = f"{w['p']['o']['file']} {w['p']['o']['name']}"
    if w["elastic"] and "--min-np" not in help_text:
        print(f"k8s check: not run here: {label} (this hvd-rendezvous has no elastic driver)")
        continue
    with tempfile.TemporaryDirectory() as work:
        try:
            msg = run_indexed(w, work) if w.get("indexed") else run(w, work)
        except (OSError, RuntimeError) as e:
            msg = f"{label}: {e}"
    if msg:
        print(f"k8s check: FAIL {msg}", file=sys.stderr)
        failed = True
sys.exit(1 if failed else 0)
EOF

if [ "$rc" = 0 ]; then
    echo "k8s check: ok"
else
    echo "k8s check: FAILED" >&2
fi
exit "$rc"
