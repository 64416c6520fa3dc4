#!/usr/bin/env bash
# Runs inside the test VM as `tester` (sudo allowed), from the directory tests/vm/run.sh
# copied in (bin/, registry/). One PASS/FAIL line per scenario; exit 1 if any failed.
set -uo pipefail
HERE=$PWD
BIN=$HERE/bin
STATE=/var/lib/kat
results=()
failed=0

log() { echo "   $*"; }
result() {
  if [ "$2" = 0 ]; then results+=("PASS $1"); echo "PASS $1"; else results+=("FAIL $1"); echo "FAIL $1"; failed=1; fi
}
ONLY=$(cat "$HERE/only" 2>/dev/null || true)
scenario() {
  local name=$1; shift
  if [ -n "$ONLY" ] && ! grep -qw -- "$name" <<<"$ONLY"; then echo "== $name (skipped)"; return; fi
  echo "== $name"; "$@"; result "$name" $?
}
# Polls COMMAND until it succeeds, for up to $1 seconds.
until_ok() { local t=$1; shift; local end=$((SECONDS + t)); until "$@" >/dev/null 2>&1; do
  [ $SECONDS -lt $end ] || return 1; sleep 2; done; }

K() { sudo katcall --config "$STATE/katcall.yaml" "$@"; }
ku() { sudo systemctl --user -M kat@ "$@"; }
kuid() { id -u kat; }
slice() { echo "/sys/fs/cgroup/user.slice/user-$(kuid).slice/user@$(kuid).service/kat.slice"; }
instance_of() {  # first instance id of a workload
  K get instances -o json | python3 -c '
import json,sys
w=sys.argv[1]
for i in json.load(sys.stdin):
    if i.get("workload")==w: print(i["instanceID"]); break' "$1"
}
state_of() {
  K get instances -o json | python3 -c '
import json,sys
for i in json.load(sys.stdin):
    if i.get("instanceID")==sys.argv[1]: print(i.get("state",""))' "$1"
}
scope_of() { ls -d "$(slice)"/kat-"$1"-*.scope 2>/dev/null | sort | tail -1; }
running() { [ "$(state_of "$1")" = Running ]; }

workload() {  # NAME SCRIPT [MEMORY] [CPU] [RESTART]
  local dir=$HERE/w/$1
  mkdir -p "$dir"
  cat > "$dir/workload.kat" <<EOW
apiVersion: kat.dws.rip/v1alpha1
kind: Workload
metadata:
  name: $1
  namespace: default
spec:
  type: Service
  source:
    image: 127.0.0.1:5000/kat/busybox:latest
  replicas: 1
  restartPolicy:
    condition: ${5:-Always}
  container:
    command: ["/bin/sh", "-c", '$2']
    resources:
      limits:
        memory: ${3:-64Mi}
        cpu: ${4:-500m}
EOW
  K apply -f "$dir"
}

echo "== registry on 127.0.0.1:5000 (in the guest)"
cat > registry.yml <<EOR
version: 0.1
log: {level: error}
storage: {filesystem: {rootdirectory: $HERE/registry}}
http: {addr: 127.0.0.1:5000}
EOR
setsid "$BIN/docker-registry" serve registry.yml > registry.log 2>&1 < /dev/null &
until_ok 30 curl -sf http://127.0.0.1:5000/v2/ || { echo "registry did not start"; cat registry.log; exit 1; }

# The runtime's lifecycle suite (create, limits, OOM, fork bomb, stop, remove leaving no
# cgroup...) as tester, twice, then the escape suite: with the cgroup filesystem in a Delegate=yes scope of
# tester's systemd (the delegated v2 subtree), and as transient systemd scopes.
s_runtime_v2() {
  local t=$HERE/tests ok=0
  local env=(KAT_INIT="$BIN/kat-init" KAT_TEST_REGISTRY=127.0.0.1:5000 KAT_TEST_LAYOUT=/nonexistent
             KAT_TEST_AUTH_REGISTRY=127.0.0.1:5001 KAT_TEST_AUTH_CREDS=unused:unused
             KAT_TEST_CREATE_HELPER="$t/kat-runtime-helper")
  log "cgroup v2, delegated subtree (cgroupfs in a Delegate=yes scope)"
  systemd-run --user --scope -p Delegate=yes --quiet -- \
    env "${env[@]}" KAT_TEST_CGROUP_MANAGER=cgroupfs "$t/lifecycle" --test-threads 1 > rt-delegated.log 2>&1 \
    || { grep -v "^\s*[0-9]*:\|at /" rt-delegated.log | tail -40; ok=1; }
  grep -E "^test |test result" rt-delegated.log | sed 's/^/   /'
  log "systemd scopes (the suite as a user service, like kat-agent)"
  systemd-run --user --wait --pipe --quiet --collect -- \
    env "${env[@]}" KAT_TEST_CGROUP_MANAGER=systemd "$t/lifecycle" --test-threads 1 > rt-systemd.log 2>&1 \
    || { grep -v "^\s*[0-9]*:\|at /" rt-systemd.log | tail -40; ok=1; }
  grep -E "^test |test result" rt-systemd.log | sed 's/^/   /'
  # The escape suite on the delegated v2 subtree. Its workloads each need a slice of
  # 65,536 ids: tester gets 16 (the image gives it one).
  if ! grep -q '^tester:100000:1048576$' /etc/subuid; then
    sudo sed -i '/^tester:/d' /etc/subuid /etc/subgid
    echo 'tester:100000:1048576' | sudo tee -a /etc/subuid /etc/subgid >/dev/null
  fi
  log "escape attempts (workload and exec), delegated cgroup v2"
  systemd-run --user --scope -p Delegate=yes --quiet -- \
    env "${env[@]}" KAT_TEST_PROBE_DIR="$HERE/probe" KAT_TEST_CGROUP_MANAGER=cgroupfs "$t/escape" --test-threads 1 > rt-escape.log 2>&1 \
    || { grep -v "^\s*[0-9]*:\|at /" rt-escape.log | tail -40; ok=1; }
  grep -E "^test |test result|ticks" rt-escape.log | sed 's/^/   /'
  # kat-init cannot be replaced: /.kat renamed, written, unmounted, covered by a volume or an
  # image's link, all from an unprivileged agent's containers (the test that binds over
  # /.kat/init from outside takes root of the host and says it skipped).
  log "the reserved /.kat directory (workload, exec, volumes, image links), delegated cgroup v2"
  systemd-run --user --scope -p Delegate=yes --quiet -- \
    env "${env[@]}" KAT_TEST_CGROUP_MANAGER=cgroupfs "$t/reserved_dir" --test-threads 1 > rt-reserved.log 2>&1 \
    || { grep -v "^\s*[0-9]*:\|at /" rt-reserved.log | tail -40; ok=1; }
  grep -E "^test |test result" rt-reserved.log | sed 's/^/   /'
  # The layer attack as it was found, and the unpacker's ids, on this unprivileged user (the
  # property tests run on the host, root and rootless: too many cases for emulation).
  log "layer confinement: the chmod attack and the unpacker's ids, unprivileged"
  env "${env[@]}" "$t/layer_confinement" --test-threads 1 \
    a_layer_cannot_chmod_a_host_file_through_a_replaced_directory \
    the_unpacker_runs_as_an_id_that_owns_nothing > rt-layers.log 2>&1 \
    || { grep -v "^\s*[0-9]*:\|at /" rt-layers.log | tail -40; ok=1; }
  grep -E "^test |test result" rt-layers.log | sed 's/^/   /'
  grep -q "test result: ok. 2 passed" rt-layers.log || { log "layer confinement: not both tests ran"; ok=1; }
  # The tests remove their scopes; the empty kat.slice of tester goes too.
  systemctl --user stop kat.slice 2>/dev/null || true
  return $ok
}

s_setup() {
  sudo "$BIN/kat-agent" setup --dry-run > plan.txt || return 1
  grep -q "Host check" plan.txt && grep -q "delegation" plan.txt || { cat plan.txt; return 1; }
  id kat >/dev/null 2>&1 && { log "dry run created the user"; return 1; }
  sudo "$BIN/kat-agent" setup --init-binary "$BIN/kat-init" --etcd-binary "$BIN/etcd" \
    --agent-arg=--insecure-registry --agent-arg=127.0.0.1:5000 \
    --agent-arg=--allow-fetch-from --agent-arg=127.0.0.1 \
    --agent-arg=--container-pids-limit --agent-arg=64 || return 1
  ku is-active kat-agent
}

s_cluster_up() {
  until_ok 180 bash -c "sudo katcall --config $STATE/katcall.yaml get nodes | grep -q Ready" || return 1
  K get nodes
  # The agent is a user service of kat, readiness from sd_notify, in the user's manager.
  ku show kat-agent -p Type -p ActiveState -p ControlGroup | tee /dev/stderr | grep -q "ActiveState=active" || return 1
  sudo journalctl --user -M kat@ -u kat-agent --no-pager 2>/dev/null | tail -3 || true
  workload ticker 'i=0; while :; do echo tick-$i; i=$((i+1)); sleep 1; done' || return 1
  TICKER=$(instance_of ticker)
  until_ok 120 running "$TICKER" || { K get instances; return 1; }
  # The container is a scope of kat's systemd, in kat.slice.
  ku list-units --type=scope --no-pager | grep "kat-$TICKER" || return 1
  sudo systemd-cgls --no-pager "$(slice | sed 's|/sys/fs/cgroup||')" | head -8
}

# A web Service publishing port 8080 and a client that fetches it by DNS name through the
# node's network (node namespaces held by the agent's user, slirp4netns egress, the node's DNS).
web() {  # NAME HOSTPORT
  local dir=$HERE/w/$1
  mkdir -p "$dir"
  cat > "$dir/workload.kat" <<EOW
apiVersion: kat.dws.rip/v1alpha1
kind: Workload
metadata: {name: $1, namespace: default}
spec:
  type: Service
  source: {image: 127.0.0.1:5000/kat/busybox:latest}
  replicas: 1
  updateStrategy: {type: Simultaneous}
  restartPolicy: {condition: Always}
  container:
    command: ["/bin/sh", "-c", 'mkdir -p /tmp/w; echo page of \$HOSTNAME > /tmp/w/index.html; exec httpd -f -p 8080 -h /tmp/w']
EOW
  cat > "$dir/VirtualLoadBalancer.kat" <<EOW
apiVersion: kat.dws.rip/v1alpha1
kind: VirtualLoadBalancer
spec:
  ports: [{name: http, containerPort: 8080, hostPort: $2}]
EOW
  # What the apply would do first (a new workload: exit 1, nothing stored), then the apply,
  # following its rollout to the end; applied, the same directory is no change (exit 0).
  local rc=0
  K diff -f "$dir" > "$HERE/diff-$1.out" 2>&1 || rc=$?
  [ "$rc" = 1 ] && grep -q "would be created at generation 1" "$HERE/diff-$1.out" ||
    { log "katcall diff of the new workload $1: exit $rc (expected 1)"; cat "$HERE/diff-$1.out"; return 1; }
  K get workloads | grep -q "^$1 " && { log "katcall diff stored workload $1"; return 1; }
  K apply -f "$dir" --wait --timeout 240s || return 1
  rc=0; K diff -f "$dir" > "$HERE/diff-$1.out" 2>&1 || rc=$?
  [ "$rc" = 0 ] || { log "katcall diff after the apply: exit $rc (expected 0)"; cat "$HERE/diff-$1.out"; return 1; }
  log "diff, apply --wait, diff: $(tail -1 "$HERE/diff-$1.out")"
}
fetch_by_name() {  # from the ticker's container: web's page by its DNS name
  K exec "ticker/$(instance_of ticker)" -- sh -c "printf 'GET /index.html HTTP/1.0\r\n\r\n' | nc -w 5 web 8080" | grep -q "page of web-"
}
s_network() {
  web web 8080 || return 1
  until_ok 120 running "$(instance_of web)" || { K get instances -o wide; return 1; }
  K get instances -o wide
  until_ok 60 curl -sf http://127.0.0.1:8080/index.html || { log "hostPort 8080 did not answer"; return 1; }
  log "published port: $(curl -s http://127.0.0.1:8080/index.html)"
  until_ok 60 fetch_by_name || { log "the ticker could not fetch web by name"; return 1; }
  log "ticker → web by DNS name: ok"
}

# The node's dashboard (kat-agent a user service of kat, behind its own TLS): nothing without a
# session, a sign-in with the admin token, the web workload on its namespace's page, and the
# page's live stream sending its content.
s_dashboard() {
  local endpoint token code jar=$HERE/ui.cookies
  endpoint=$(sudo awk '/^endpoint:/ {print $2}' "$STATE/katcall.yaml" | tr -d "'\"")
  token=$(sudo awk '/^token:/ {print $2}' "$STATE/katcall.yaml" | tr -d "'\"")
  code=$(curl -sk -o /dev/null -w '%{http_code}' "$endpoint/ui/n/default")
  [ "$code" = 303 ] || { log "the page without a session: $code (expected 303 to the sign-in page)"; return 1; }
  code=$(curl -sk -c "$jar" -o /dev/null -w '%{http_code}' -H "Origin: $endpoint" \
    --data-urlencode "token=$token" "$endpoint/ui/login")
  [ "$code" = 303 ] || { log "sign-in: $code (expected 303)"; return 1; }
  curl -sk -b "$jar" "$endpoint/ui/n/default" | grep -q 'data-workload="web"' ||
    { log "web is not on the workloads page"; return 1; }
  timeout 8 curl -skN -b "$jar" "$endpoint/ui/live?page=/ui/n/default" > "$HERE/live.out" 2>/dev/null
  grep -q '^event: content' "$HERE/live.out" || { log "no content on the live stream"; head -c 300 "$HERE/live.out"; return 1; }
  log "dashboard: sign-in, workloads page, live stream: ok"
}

# A git workload built on the node: a repository served by git daemon in the guest, buildah
# run by the agent (a user service of kat) in a transient scope of kat.slice, in the user
# namespace of the node's last id slice; the result runs, its build log and events are there,
# and no workspace is left.
s_build() {
  local repo=$HERE/git ok=0
  rm -rf "$repo"; mkdir -p "$repo/app/ctx"
  git -C "$repo/app" init -q -b main
  printf 'FROM 127.0.0.1:5000/kat/busybox:latest\nRUN echo built-in-the-vm > /built\nCOPY msg /msg\n' > "$repo/app/ctx/Dockerfile"
  echo "commit one" > "$repo/app/ctx/msg"
  git -C "$repo/app" add -A
  git -C "$repo/app" -c user.name=KAT -c user.email=kat@test.invalid commit -q -m one
  local commit; commit=$(git -C "$repo/app" rev-parse HEAD)
  setsid git daemon --reuseaddr --export-all --listen=127.0.0.1 --port=9418 --base-path="$repo" "$repo" \
    > gitd.log 2>&1 < /dev/null &
  until_ok 30 git ls-remote git://127.0.0.1:9418/app || { log "git daemon did not start"; cat gitd.log; return 1; }
  local dir=$HERE/w/gitvm
  mkdir -p "$dir"
  cat > "$dir/workload.kat" <<EOW
apiVersion: kat.dws.rip/v1alpha1
kind: Workload
metadata: {name: gitvm, namespace: default}
spec:
  type: Service
  source:
    git: {repository: "git://127.0.0.1:9418/app", branch: main}
  replicas: 1
  restartPolicy: {condition: Always}
  container:
    command: ["/bin/sh", "-c", 'cat /built /msg; exec sleep 3600']
EOW
  cat > "$dir/build.kat" <<EOW
apiVersion: kat.dws.rip/v1alpha1
kind: BuildDefinition
spec: {buildContext: ctx}
EOW
  local t0=$SECONDS
  K apply -f "$dir" || return 1
  local id; id=$(instance_of gitvm)
  until_ok 900 running "$id" || { K describe workload gitvm; K get instances -o wide; return 1; }
  log "apply to running: $((SECONDS - t0)) s (build under emulation)"
  local out; out=$(K logs "gitvm/$id")
  grep -q built-in-the-vm <<<"$out" || { log "the built image did not run: $out"; ok=1; }
  out=$(K describe workload gitvm)
  sed -n '/^Source/p;/^Builds/,/^$/p' <<<"$out" | sed 's/^/   /'
  grep -q "at $commit" <<<"$out" || { log "describe does not show the commit"; ok=1; }
  out=$(K logs --build gitvm)
  grep -q "STEP" <<<"$out" || { log "no build output: $out"; ok=1; }
  log "build output: $(grep -c . <<<"$out") lines"
  until_ok 30 bash -c "sudo katcall --config $STATE/katcall.yaml events --for-name gitvm | grep -q BuildSucceeded" \
    || { log "no BuildSucceeded event"; K events --for-name gitvm; ok=1; }
  local left; left=$(sudo ls -A "$STATE/node/runtime/builds" 2>/dev/null | grep -v '^logs$' || true)
  [ -z "$left" ] || { log "build workspaces left: $left"; ok=1; }
  K delete workload gitvm >/dev/null
  pkill -f "git daemon" || true
  return $ok
}

s_limits() {
  local ok=0
  # The guest has 2 cpus (1900m allocatable) and limits count as requests: ticker and
  # spinner take 1000m, so hog and bomb get 200m each to fit.
  workload spinner 'while :; do :; done' 64Mi 500m || return 1
  # tail holds 200 MiB (no newline); the OOM killer picks it and the workload fails with it.
  workload hog 'echo allocating; head -c 200m /dev/zero | tail' 32Mi 200m Never || return 1
  # The bomb runs in a subshell: sh gives up at the first refused fork, and the outer shell
  # (one task freed) stays, so the scope and its pids.events outlive the bomb.
  workload bomb '(i=0; while [ $i -lt 200 ]; do sleep 30 & i=$((i+1)); done; echo all 200 spawned); echo bomb ended with $?; sleep 3600' 64Mi 200m || return 1
  local spin hog bomb
  until_ok 60 bash -c "sudo katcall --config $STATE/katcall.yaml get instances | grep -q '^bomb-'" ||
    { log "bomb has no instance"; K describe workload bomb; return 1; }
  spin=$(instance_of spinner); hog=$(instance_of hog); bomb=$(instance_of bomb)
  until_ok 120 running "$spin" || { K get instances; return 1; }
  local scope; scope=$(scope_of "$spin")
  log "spinner scope: $scope"
  local cpumax; cpumax=$(sudo cat "$scope/cpu.max")
  log "cpu.max = $cpumax"
  [ "$cpumax" = "50000 100000" ] || ok=1
  sleep 5
  local throttled; throttled=$(sudo awk '/^nr_throttled/ {print $2}' "$scope/cpu.stat")
  log "cpu.stat nr_throttled = $throttled"
  [ "${throttled:-0}" -gt 0 ] || ok=1
  log "memory.max = $(sudo cat "$scope/memory.max")"
  [ "$(sudo cat "$scope/memory.max")" = 67108864 ] || ok=1
  # The container sees its own cgroup, read-only, at /sys/fs/cgroup (kat-init reads
  # memory.events there before it exits).
  local inside; inside=$(K exec "spinner/$spin" -- cat /sys/fs/cgroup/memory.max)
  log "memory.max inside the container = $inside"
  [ "$inside" = 67108864 ] || ok=1
  K exec "spinner/$spin" -- sh -c 'echo 1 > /sys/fs/cgroup/memory.max' 2>/dev/null && { log "cgroup writable inside"; ok=1; }
  # Under restartPolicy Never the OOM-killed instance ends OOMKilled, is kept with its end
  # (get instances --all) and replaced by a new one (event InstanceReplaced).
  oom() { K get instances --all -o json | python3 -c '
import json,sys
sys.exit(0 if any(i.get("instanceID")==sys.argv[1] and i.get("state")=="OOMKilled" for i in json.load(sys.stdin)) else 1)' "$hog"; }
  until_ok 180 oom || { log "hog is not OOMKilled:"; K get instances --all; ok=1; }
  K events --for-name hog | grep "InstanceReplaced" | grep -q "$hog.*OOM-killed" \
    || { log "no InstanceReplaced event naming the OOM kill"; K events --for-name hog; ok=1; }
  log "hog: OOMKilled, replaced"
  until_ok 180 bash -c "sudo test -n \"\$(ls -d $(slice)/kat-$bomb-*.scope 2>/dev/null)\"" || { ok=1; }
  local bscope; bscope=$(scope_of "$bomb")
  until_ok 120 bash -c "sudo grep -q 'max [1-9]' $bscope/pids.events" || { log "no fork refused"; ok=1; }
  K logs "bomb/$bomb" | sed 's/^/   bomb: /'
  K logs "bomb/$bomb" | grep -q "all 200 spawned" && { log "the bomb was not stopped"; ok=1; }
  log "pids.max = $(sudo cat "$bscope/pids.max"), pids.current = $(sudo cat "$bscope/pids.current"), $(sudo cat "$bscope/pids.events")"
  [ "$(sudo cat "$bscope/pids.max")" = 64 ] || ok=1
  K delete workload bomb >/dev/null
  K delete workload hog >/dev/null
  # Gone only after their drain (spec.drainSeconds, 5 s) and stop: later scenarios count scopes.
  # Both must be gone (`ls` of the two fails as soon as either one is, so it asks for output).
  until_ok 120 bash -c "[ -z \"\$(ls -d $(slice)/kat-bomb-*.scope $(slice)/kat-hog-*.scope 2>/dev/null)\" ]" \
    || { log "bomb or hog still has a scope"; ls -d "$(slice)"/kat-*.scope; ok=1; }
  return $ok
}

s_agent_restart() {
  local spin scope before after
  spin=$(instance_of spinner); scope=$(scope_of "$spin")
  before=$(sudo cat "$scope/cgroup.procs" | sort | tr '\n' ' ')
  ls -d "$(slice)"/kat-*.scope
  local scopes_before; scopes_before=$(ls -d "$(slice)"/kat-*.scope | wc -l)
  local agent_before; agent_before=$(ku show kat-agent -p MainPID --value)
  ku restart kat-agent || return 1
  local agent_after; agent_after=$(ku show kat-agent -p MainPID --value)
  log "agent pid $agent_before -> $agent_after"
  [ "$agent_before" != "$agent_after" ] || return 1
  until_ok 120 bash -c "sudo katcall --config $STATE/katcall.yaml get nodes | grep -q Ready" || return 1
  after=$(sudo cat "$scope/cgroup.procs" | sort | tr '\n' ' ')
  log "spinner processes before: $before after: $after"
  [ -n "$before" ] && [ "$before" = "$after" ] || return 1
  sleep 6   # a few supervisor passes: nothing may be recreated
  local scopes_after; scopes_after=$(ls -d "$(slice)"/kat-*.scope | wc -l)
  log "container scopes: $scopes_before -> $scopes_after"
  if [ "$scopes_before" = "$scopes_after" ] && running "$spin"; then
    # The node network (its own scope) outlived the service: pages still flow.
    curl -sf http://127.0.0.1:8080/index.html >/dev/null || { log "hostPort lost across the restart"; return 1; }
    until_ok 20 fetch_by_name || { log "container network lost across the restart"; return 1; }
    return 0
  fi
  ls "$(slice)"; K get instances
  sudo journalctl --user -M kat@ -u kat-agent --no-pager 2>/dev/null | grep -v " INFO " | tail -25
  return 1
}

s_reboot() {
  local ticker logfile lines_before
  ticker=$(instance_of ticker)
  lines_before=$(K logs "ticker/$ticker" | grep -c tick-)
  log "ticker lines before: $lines_before"
  # Everything of kat's stops, as at shutdown; the unit comes back with the user manager.
  sudo systemctl stop "user@$(kuid).service" || return 1
  [ -z "$(ls -d "$(slice)"/kat-*.scope 2>/dev/null)" ] || { log "scopes left after stop"; return 1; }
  sudo systemctl start "user@$(kuid).service" || return 1
  until_ok 240 bash -c "sudo katcall --config $STATE/katcall.yaml get nodes | grep -q Ready" || return 1
  until_ok 180 running "$ticker" || { K get instances; return 1; }
  until_ok 60 running "$(instance_of spinner)" || return 1
  sleep 3
  # The attempt before the reboot keeps its log (`logs --previous`); the new one goes on.
  local old; old=$(K logs --previous "ticker/$ticker" | grep -c tick-)
  local now; now=$(K logs "ticker/$ticker" | grep -c tick-)
  log "ticker lines before the reboot (logs --previous): $old, since: $now"
  [ "$old" -ge "$lines_before" ] && [ "$now" -gt 0 ]
}

# RFC 001 §5.4–5.5 on a setup-installed node, by the steps of docs/operations.md: a manual
# backup (0600, owned by kat, its checksum beside it), a workload applied after it, the
# agent stopped (containers keep running), `kat-agent restore` as kat, the agent started:
# the backup's workloads are adopted (same instance ids, same processes), the later one is
# gone as a whole and its container stopped.
s_backup_restore() {
  local ticker spin snap late late_scope before after
  ticker=$(instance_of ticker); spin=$(instance_of spinner)
  K backup create || return 1
  K get backups | tee /dev/stderr | grep -q manual || return 1
  snap=$(sudo sh -c "ls -t $STATE/backups/*.db" | head -1)
  [ -n "$snap" ] || { log "no snapshot file in $STATE/backups"; return 1; }
  [ "$(sudo stat -c '%a %U' "$snap")" = "600 kat" ] || { sudo ls -l "$snap"; return 1; }
  # The .sha256 file is `sha256sum -c` input (the directory is kat's alone, 0700).
  sudo sh -c "cd '$(dirname "$snap")' && sha256sum -c '$(basename "$snap").sha256'" || return 1
  workload late 'while :; do sleep 1; done' || return 1
  late_running() { local id; id=$(instance_of late); [ -n "$id" ] && running "$id"; }
  until_ok 120 late_running || { K get instances; return 1; }
  late=$(instance_of late); late_scope=$(scope_of "$late")
  [ -n "$late_scope" ] || { log "no scope for late"; return 1; }
  before=$(sudo cat "$(scope_of "$spin")/cgroup.procs" | sort | tr '\n' ' ')
  ku stop kat-agent || return 1
  [ "$(sudo cat "$(scope_of "$spin")/cgroup.procs" | sort | tr '\n' ' ')" = "$before" ] \
    || { log "the spinner stopped with the agent"; return 1; }
  sudo install -m 0755 "$BIN/etcdctl" /usr/local/bin/etcdctl || return 1
  local t0=$SECONDS
  (cd / && sudo -u kat /usr/local/bin/kat-agent restore --data-dir "$STATE/node" \
      --snapshot "$snap" --etcdctl /usr/local/bin/etcdctl) || return 1
  ku start kat-agent || return 1
  until_ok 240 bash -c "sudo katcall --config $STATE/katcall.yaml get nodes | grep -q Ready" || return 1
  until_ok 120 running "$ticker" || { K get instances; return 1; }
  until_ok 60 running "$spin" || { K get instances; return 1; }
  log "restore to Ready with the backup's workloads running: $((SECONDS - t0)) s"
  after=$(sudo cat "$(scope_of "$spin")/cgroup.procs" | sort | tr '\n' ' ')
  log "spinner processes before: $before after: $after"
  [ "$before" = "$after" ] || { log "the spinner was not adopted"; return 1; }
  K get workloads | grep -qw late && { log "late is still there after the restore"; return 1; }
  until_ok 120 bash -c "[ ! -d '$late_scope' ]" || { log "late's container still runs: $late_scope"; return 1; }
  sudo rm -f /usr/local/bin/etcdctl
  sudo sh -c "rm -rf $STATE/node/etcd.before-restore-*"
}

s_uninstall() {
  sudo "$BIN/kat-agent" setup --uninstall || return 1
  local left=0
  id kat >/dev/null 2>&1 && { log "user kat still exists"; left=1; }
  [ -e "$STATE" ] && { log "$STATE still exists"; left=1; }
  ls /usr/local/bin/kat-agent /usr/local/lib/kat /etc/kat /etc/systemd/system/user@.service.d/kat-delegate.conf 2>/dev/null && left=1
  grep -q '^kat:' /etc/subuid /etc/subgid && { log "subids left"; left=1; }
  pgrep -f kat-agent && { log "processes left"; left=1; }
  ls -d /sys/fs/cgroup/user.slice/user-*.slice/user@*.service/kat.slice 2>/dev/null && left=1
  return $left
}

scenario runtime-v2 s_runtime_v2
scenario setup s_setup
if [ "${results[-1]:-}" = "PASS setup" ]; then
  scenario cluster-up s_cluster_up
  scenario network s_network
  scenario dashboard s_dashboard
  scenario build s_build
  scenario limits s_limits
  scenario agent-restart s_agent_restart
  scenario reboot s_reboot
  scenario backup-restore s_backup_restore
  scenario uninstall s_uninstall
fi
echo
echo "== VM scenarios"
printf '%s\n' "${results[@]}"
exit $failed
