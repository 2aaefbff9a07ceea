#!/bin/sh
# Sets up a fresh Debian 12 machine, builds hvd and runs the main job.
# Until hvdrun exists the main job is two parts: the rendezvous store (start
# hvd-rendezvous with a job token, store a key and read it back with curl,
# stop it cleanly), then a checked allreduce over 2 local ranks with
# hvd-bench, which forks the ranks and serves their store itself.
set -eu
cd "$(dirname "$0")/.."

./scripts/setup.sh
dir=$(./scripts/build.sh | tail -n 1)

work=$(mktemp -d)
trap 'kill "$server" 2>/dev/null || true; rm -rf "$work"' EXIT
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$work/token"
token=$(cat "$work/token")

"$dir/bin/hvd-rendezvous" --bind 127.0.0.1 --port 0 --token-file "$work/token" \
    > "$work/out" 2> "$work/err" &
server=$!
for _ in $(seq 100); do
    [ -s "$work/out" ] && break
    sleep 0.05
done
line=$(head -n 1 "$work/out")
echo "hvd-rendezvous: $line"
port=${line##*:}
url="http://127.0.0.1:$port"
auth="Authorization: Bearer $token"

echo "\$ curl -X PUT --data 10.0.0.1:40000 $url/global/0"
curl -sS -H "$auth" -X PUT --data 10.0.0.1:40000 "$url/global/0" -o /dev/null -w 'HTTP %{http_code}\n'
echo "\$ curl $url/global/0"
curl -sS -H "$auth" "$url/global/0"; echo
echo "\$ curl $url/global/1    (a missing key)"
curl -sS -H "$auth" "$url/global/1" -o /dev/null -w 'HTTP %{http_code}\n'
echo "\$ curl $url/global      (the whole scope)"
curl -sS -H "$auth" "$url/global"
echo "\$ curl $url/global/0    (without the job token)"
curl -sS "$url/global/0"
echo "\$ curl $url/_health"
curl -sS "$url/_health"; echo

kill -TERM "$server"
wait "$server"
echo "hvd-rendezvous stopped cleanly"

echo "\$ hvd-bench allreduce --np 2 -b 8 -e 16M -f 16 -c 1"
"$dir/bin/hvd-bench" allreduce --np 2 -b 8 -e 16M -f 16 -c 1
