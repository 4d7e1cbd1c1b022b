#!/usr/bin/env bash
# The runner contract: what every runner child of runner-scaler runs (GitHub Actions and
# Forgejo Actions). One credential, one registration, one listener, one job, then exit.
#
# Settings (environment; the job files fill them from dispatch meta):
#   RUNNER_FORGE               github | forgejo
#   REPO_URL                   meta repo_url, https://HOST/OWNER/REPO
#   RUNNER_NAME                meta runner_name
#   RUNNER_LABELS              meta labels, comma-separated, lower-case
#   RUNNER_TOKEN               meta runner_token (app and forgejo modes), or
#   RUNNER_CREDENTIAL_FILE     a file holding the credential (vault mode: the prestart task
#                              writes it); read, then deleted
#   RUNNER_CREDENTIAL_WRAPPED  auto (default) | true | false: see "Credentials" below
#   VAULT_ADDR, VAULT_CACERT, VAULT_NAMESPACE   where a wrapped credential is unwrapped;
#                              VAULT_CACERT counts only when its file is not empty (the job
#                              files render it from an optional Nomad Variable)
#   RUNNER_IDLE_TIMEOUT        15m (default); 900s and 900 mean the same
#   RUNNER_WORK_DIR            default $NOMAD_TASK_DIR/work: inside this allocation, never shared
#   RUNNER_HOME                the actions runner's directory (config.sh, run.sh), /home/runner
#   FORGEJO_RUNNER             the forgejo-runner binary, default forgejo-runner
#   RUNNER_ENV_ALLOW           extra variable names (space-separated) the job may see
#
# Credentials. RUNNER_TOKEN holds ONE of:
#   - a Vault response-wrapping token. It is unwrapped with POST $VAULT_ADDR/v1/sys/wrapping/unwrap,
#     the wrapping token as X-Vault-Token, no body, no other token (a second token would revoke
#     it). The unwrapped data is exactly one of {"jitconfig"}, {"registration_token"} or
#     {"runner_uuid", "runner_token"}. A 400 "wrapping token is not valid or does not exist"
#     means someone else unwrapped it first: exit 4, never fall back.
#   - the plain credential: on GitHub an encoded JIT config (base64 of a JSON object) or a
#     registration token; on Forgejo "<uuid>:<token>" of a runner the daemon registered, or a
#     registration token.
#   Wrapped or plain: RUNNER_CREDENTIAL_WRAPPED=true or false says so; auto (the default)
#   means wrapped exactly when VAULT_ADDR is set and the value starts with "hvs." or "s."
#   (Vault's service-token prefixes). No plain credential starts so: JIT configs are base64
#   (no "."), GitHub registration tokens are upper-case letters and digits, and a Forgejo
#   "<uuid>:<token>" starts with hex digits.
#
# Exit codes:
#   0  a job was assigned and the runner ended cleanly after it
#   2  bad settings (missing meta, an unknown mode, an unparseable timeout)
#   3  no job was ever assigned: the idle timeout stopped the runner, Nomad stopped it, or
#      the listener ended by itself without one
#   4  the wrapped credential had already been unwrapped by someone else (possible theft),
#      or by an earlier allocation of this child (a replacement): the log says how to tell
#   1 or the runner's own code: the runner failed (a code of 2, 3 or 4 becomes 1)
#
# Secrets: the script first starts itself again without any secret in its environment (see
# below: /proc/PID/environ), with the credential in a file it reads and deletes. Every
# credential is read into an unexported shell variable and unset before the listener starts;
# the listener starts from an environment rebuilt from an allow-list, so no workflow step
# inherits RUNNER_TOKEN, NOMAD_META_runner_token, VAULT_TOKEN, NOMAD_TOKEN or the unwrapped
# values, nor finds them in this script's /proc/PID/environ. The one exception is the
# actions runner's own: it is started with its JIT config in ACTIONS_RUNNER_INPUT_JITCONFIG,
# which stays in its /proc/PID/environ; that config registers only this runner, which the
# job runs on anyway.
set -euo pipefail

log() { printf 'runner-entrypoint: %s\n' "$*" >&2; }
die() {
  local code=$1
  shift
  log "$*"
  exit "$code"
}

# ---- a start without secrets in the environment ----

# /proc/PID/environ keeps the environment a process was started with, whatever the process
# unsets later, and every process of the same uid may read it: every workflow step, since the
# runner runs jobs as its own user. This script is the container's first process, so the
# credential (a registration token is good for an hour, or for any number of runners) would
# stay readable there for the runner's whole life. So the first start moves the credential to
# a file only this uid reads (read and deleted below, before any listener exists) and starts
# the script again, by exec, from an environment without any secret.
if [[ -z ${RUNNER_ENTRYPOINT_RESTARTED:-} ]]; then
  if [[ -z ${RUNNER_CREDENTIAL_FILE:-} && -n ${RUNNER_TOKEN:-} && $RUNNER_TOKEN != *'${'* ]]; then
    handoff=$(umask 077 && mktemp -d "${TMPDIR:-/tmp}/runner-credential.XXXXXX") ||
      die 1 "could not make a directory for the credential"
    (umask 077 && printf '%s' "$RUNNER_TOKEN" >"$handoff/credential") ||
      die 1 "could not write the credential to $handoff"
    export RUNNER_CREDENTIAL_FILE=$handoff/credential RUNNER_CREDENTIAL_HANDOFF=$handoff
  fi
  unset RUNNER_TOKEN NOMAD_META_runner_token NOMAD_META_RUNNER_TOKEN VAULT_TOKEN NOMAD_TOKEN \
    CONSUL_HTTP_TOKEN
  export RUNNER_ENTRYPOINT_RESTARTED=1
  exec bash "${BASH_SOURCE[0]}" "$@"
fi
unset RUNNER_ENTRYPOINT_RESTARTED

# ---- settings ----

forge=${RUNNER_FORGE:-github}
case $forge in github | forgejo) ;; *) die 2 "RUNNER_FORGE must be github or forgejo, not '$forge'" ;; esac

# Nomad leaves an unset meta key's ${NOMAD_META_x} uninterpolated, so a literal "${" counts as
# missing too.
# shellcheck disable=SC2016 # the literal text, not an expansion
uninterpolated='${'
setting() {
  local name=$1 value=${!1:-}
  [[ -n $value && $value != *"$uninterpolated"* ]] || die 2 "missing setting $name (dispatch meta ${2:-})"
  printf '%s' "$value"
}
repo_url=$(setting REPO_URL repo_url)
runner_name=$(setting RUNNER_NAME runner_name)
labels=${RUNNER_LABELS:-}
[[ $labels == *"$uninterpolated"* ]] && labels=
[[ $runner_name =~ ^[A-Za-z0-9._-]+$ ]] || die 2 "RUNNER_NAME '$runner_name' has characters a runner name cannot have"
[[ -z $labels || $labels =~ ^[a-z0-9._:-]+(,[a-z0-9._:-]+)*$ ]] || die 2 "RUNNER_LABELS '$labels' is not a comma-separated list of lower-case labels"
[[ $repo_url =~ ^https?://[^/]+/[^/]+/[^/]+$ ]] || die 2 "REPO_URL '$repo_url' is not https://HOST/OWNER/REPO"

# 15m, 900s and 900 are the same timeout.
seconds() {
  local value=$1
  case $value in
    *[0-9]h) value=${value%h} && [[ $value =~ ^[0-9]+$ ]] && echo $((10#$value * 3600)) ;;
    *[0-9]m) value=${value%m} && [[ $value =~ ^[0-9]+$ ]] && echo $((10#$value * 60)) ;;
    *[0-9]s) value=${value%s} && [[ $value =~ ^[0-9]+$ ]] && echo $((10#$value)) ;;
    *) [[ $value =~ ^[0-9]+$ ]] && echo $((10#$value)) ;;
  esac
}
idle_timeout=${RUNNER_IDLE_TIMEOUT:-15m}
idle_s=$(seconds "$idle_timeout") || die 2 "RUNNER_IDLE_TIMEOUT '$idle_timeout' is not like 15m, 900s or 900"
((idle_s > 0)) || die 2 "RUNNER_IDLE_TIMEOUT must be more than zero"

wrapped=${RUNNER_CREDENTIAL_WRAPPED:-auto}
case $wrapped in auto | true | false) ;; *) die 2 "RUNNER_CREDENTIAL_WRAPPED must be auto, true or false" ;; esac

work=${RUNNER_WORK_DIR:-${NOMAD_TASK_DIR:-$PWD}/work}
runner_home=${RUNNER_HOME:-/home/runner}
forgejo_runner=${FORGEJO_RUNNER:-forgejo-runner}

# ---- the credential, then no secret left in the environment ----

credential=
if [[ -n ${RUNNER_CREDENTIAL_FILE:-} ]]; then
  [[ -s $RUNNER_CREDENTIAL_FILE ]] || die 2 "RUNNER_CREDENTIAL_FILE $RUNNER_CREDENTIAL_FILE is missing or empty"
  credential=$(<"$RUNNER_CREDENTIAL_FILE")
  rm -f -- "$RUNNER_CREDENTIAL_FILE" || log "could not delete $RUNNER_CREDENTIAL_FILE"
  if [[ -n ${RUNNER_CREDENTIAL_HANDOFF:-} ]]; then
    rmdir -- "$RUNNER_CREDENTIAL_HANDOFF" || log "could not delete $RUNNER_CREDENTIAL_HANDOFF"
  fi
elif [[ -n ${RUNNER_TOKEN:-} && $RUNNER_TOKEN != *"$uninterpolated"* ]]; then
  credential=$RUNNER_TOKEN
fi
# The whole secret inventory of this task: none of it may reach the listener.
unset RUNNER_TOKEN NOMAD_META_runner_token NOMAD_META_RUNNER_TOKEN VAULT_TOKEN NOMAD_TOKEN \
  CONSUL_HTTP_TOKEN RUNNER_CREDENTIAL_FILE RUNNER_CREDENTIAL_HANDOFF
[[ -n $credential ]] || die 2 "no credential: set RUNNER_TOKEN (dispatch meta runner_token) or RUNNER_CREDENTIAL_FILE"

state=$(mktemp -d "${TMPDIR:-/tmp}/runner-entrypoint.XXXXXX")
chmod 700 "$state"
trap 'rm -rf -- "$state"' EXIT

# Values of the shapes we expect (tokens, UUIDs, base64) carry no JSON escapes.
json_string() {
  local re="\"$2\"[[:space:]]*:[[:space:]]*\"([^\"\\\\]*)\""
  [[ $1 =~ $re ]] && printf '%s' "${BASH_REMATCH[1]}"
}

if [[ $wrapped == auto ]]; then
  if [[ -n ${VAULT_ADDR:-} && ($credential == hvs.* || $credential == s.*) ]]; then wrapped=true; else wrapped=false; fi
fi

kind='' jitconfig='' registration_token='' runner_uuid='' runner_secret=''
if [[ $wrapped == true ]]; then
  [[ -n ${VAULT_ADDR:-} ]] || die 2 "the credential is wrapped but VAULT_ADDR is not set"
  url="${VAULT_ADDR%/}/v1/sys/wrapping/unwrap"
  # The job files always set VAULT_CACERT and render the file from a Nomad Variable only when
  # the operator put one (a private CA): an empty file means the system CAs decide.
  cacert=
  if [[ -s ${VAULT_CACERT:-} ]]; then
    cacert=$VAULT_CACERT
  elif [[ -n ${VAULT_CACERT:-} ]]; then
    log "no CA in VAULT_CACERT ($VAULT_CACERT): Vault's certificate is checked against the system CAs"
  fi
  if command -v curl >/dev/null; then
    # The wrapping token goes in a header read from a file descriptor, never on a command
    # line; no body and no other token (API-CONTRACTS 4.4: both at once revokes it).
    curl_args=(-sS -X POST -o "$state/unwrap" -w '%{http_code}' -H @/dev/fd/3)
    [[ -n $cacert ]] && curl_args+=(--cacert "$cacert")
    [[ -n ${VAULT_NAMESPACE:-} ]] && curl_args+=(-H "X-Vault-Namespace: $VAULT_NAMESPACE")
    status=$(curl "${curl_args[@]}" "$url" 3< <(printf 'X-Vault-Token: %s\n' "$credential")) ||
      die 1 "could not reach Vault at $VAULT_ADDR to unwrap the credential"
  elif command -v wget >/dev/null; then
    # BusyBox wget (the Alpine-based forgejo/runner image has no curl). It takes headers only
    # as flags, so the wrapping token is on its command line for the moment of the request,
    # before any job exists; it reports an HTTP error only as a message and keeps no body.
    # It takes no CA file either: with a private CA, the image must carry the CA in its system
    # bundle, or curl (README, "Vault with a private CA").
    [[ -z $cacert ]] || log "wget cannot use VAULT_CACERT; the system CAs decide"
    wget_args=(-q -O "$state/unwrap" --header "X-Vault-Token: $credential" --post-data '')
    [[ -n ${VAULT_NAMESPACE:-} ]] && wget_args+=(--header "X-Vault-Namespace: $VAULT_NAMESPACE")
    if wget "${wget_args[@]}" "$url" 2>"$state/wget.err"; then
      status=200
    else
      status=$(sed -n 's/.*returned error: HTTP\/[0-9.]* \([0-9][0-9]*\).*/\1/p' "$state/wget.err")
      [[ -n $status ]] || die 1 "could not reach Vault at $VAULT_ADDR to unwrap the credential"
      # With the wrapping token as the only credential and no body, Vault's 400 is "wrapping
      # token is not valid or does not exist"; wget shows no body to confirm it.
      [[ $status == 400 ]] && printf '%s' "wrapping token is not valid or does not exist" >"$state/unwrap"
    fi
  else
    die 2 "unwrapping the credential needs curl or wget in the image"
  fi
  touch "$state/unwrap"
  body=$(<"$state/unwrap")
  rm -f "$state/unwrap"
  credential=
  if [[ $status == 400 && $body == *"wrapping token is not valid or does not exist"* ]]; then
    log "SECURITY: the wrapped credential for runner $runner_name was already unwrapped or has expired."
    log "SECURITY: if it was not expired, someone else read it: possible credential theft. Not registering."
    # Every allocation of a child reads the same dispatch meta: a second allocation of it (the
    # replacement of one on a lost or drained node) finds the credential its first one spent.
    # Where to look, with ids that are no secret.
    if [[ -n ${NOMAD_JOB_ID:-} && -n ${NOMAD_ALLOC_ID:-} ]]; then
      log "SECURITY: this is allocation $NOMAD_ALLOC_ID of $NOMAD_JOB_ID: if \`nomad job status -namespace ${NOMAD_NAMESPACE:-default} $NOMAD_JOB_ID\` lists an earlier allocation of it (lost, unknown, or stopped by a drain), that one unwrapped the credential and this is a replacement; if it lists only this one, no allocation of this runner did."
    fi
    exit 4
  fi
  [[ $status == 200 ]] || die 1 "Vault refused to unwrap the credential (HTTP $status)"
  if jitconfig=$(json_string "$body" jitconfig); then
    kind=jit
  elif registration_token=$(json_string "$body" registration_token); then
    kind=registration
  elif runner_uuid=$(json_string "$body" runner_uuid) && runner_secret=$(json_string "$body" runner_token); then
    kind=runner
  else
    die 1 "the unwrapped credential has none of jitconfig, registration_token, runner_uuid+runner_token"
  fi
  body=
else
  if [[ $forge == github ]]; then
    # An encoded JIT config is base64 of a JSON object; a registration token is ~29 letters.
    if [[ ${#credential} -gt 100 ]] && [[ $(printf '%s' "$credential" | base64 -d 2>/dev/null | head -c 1) == '{' ]]; then
      kind=jit jitconfig=$credential
    else
      kind=registration registration_token=$credential
    fi
  elif [[ $credential =~ ^([0-9a-fA-F-]{36}):(.+)$ ]]; then
    kind=runner runner_uuid=${BASH_REMATCH[1]} runner_secret=${BASH_REMATCH[2]}
  else
    kind=registration registration_token=$credential
  fi
  credential=
fi
if [[ $forge == github && $kind == runner ]]; then
  die 2 "a Forgejo runner credential was given to a GitHub runner"
fi
if [[ $forge == forgejo && $kind == jit ]]; then
  die 2 "a GitHub JIT config was given to a Forgejo runner"
fi

mkdir -p "$work"

# ---- starting the listener with a clean environment ----

# What the listener and every job step may see: the image's own settings and Nomad's
# non-secret runtime variables. Everything else (meta, tokens, VAULT_*) is dropped.
allowed_env() {
  case $1 in
    PATH | HOME | USER | LOGNAME | SHELL | LANG | LANGUAGE | LC_* | TZ | TERM | HOSTNAME | TMPDIR) return 0 ;;
    ImageOS | DEBIAN_FRONTEND | RUNNER_MANUALLY_TRAP_SIG | ACTIONS_RUNNER_PRINT_LOG_TO_STDOUT) return 0 ;;
    ACTIONS_RUNNER_CONTAINER_HOOKS | ACTIONS_RUNNER_HOOK_JOB_STARTED | ACTIONS_RUNNER_HOOK_JOB_COMPLETED) return 0 ;;
    http_proxy | https_proxy | no_proxy | HTTP_PROXY | HTTPS_PROXY | NO_PROXY | DOCKER_HOST) return 0 ;;
    NOMAD_ALLOC_* | NOMAD_TASK_* | NOMAD_JOB_* | NOMAD_GROUP_* | NOMAD_DC | NOMAD_REGION | NOMAD_NAMESPACE | NOMAD_CPU_* | NOMAD_MEMORY_* | NOMAD_SECRETS_DIR) return 0 ;;
  esac
  [[ " ${RUNNER_ENV_ALLOW:-} " == *" $1 "* ]]
}

# Runs "$@" with only the allowed variables plus the NAME=VALUE pairs before "--". Used
# inside a subshell: the values never appear on any command line.
exec_clean() {
  local name
  while IFS= read -r name; do
    allowed_env "$name" || unset -v "$name" 2>/dev/null || true
  done < <(compgen -e)
  while [[ $1 != -- ]]; do
    export "${1?}"
    shift
  done
  shift
  exec "$@"
}

# The listener's output goes through this filter: it is copied to our stdout and tells us
# when a job was assigned (GitHub: "Running job:", printed by the listener as it hands the
# job to Runner.Worker, actions/runner src/Runner.Listener/JobDispatcher.cs; Forgejo:
# "task N repo is", logged when a task was fetched, forgejo/runner
# internal/app/run/runner.go) and, on GitHub, the listener's real exit code, which run.sh
# turns into 0 (src/Misc/layoutroot/run-helper.sh.template prints it).
filter_output() {
  local line
  while IFS= read -r line || [[ -n $line ]]; do
    printf '%s\n' "$line"
    case $line in
      *"Running job: "* | *"task "*" repo is "*) : >"$state/job" ;;
      *"could not fetch task"*) : >"$state/no-task" ;;
      *"Runner listener exit with terminated error"*) echo 1 >"$state/listener-code" ;;
      *"Runner listener exit with Session Conflict error"*) echo 5 >"$state/listener-code" ;;
      *"Runner listener exit with deprecated version exit code: "*) echo "${line##*: }" | tr -dc 0-9 >"$state/listener-code" ;;
      *"Exiting with unknown error code: "*) echo "${line##*: }" | tr -dc 0-9 >"$state/listener-code" ;;
    esac
  done
}

listener='' filter='' signalled=''
forward() {
  signalled=$1
  log "received SIG$1; passing it to the runner"
  if [[ -n $listener ]]; then kill -s "$1" "$listener" 2>/dev/null || true; fi
}
trap 'forward TERM' TERM
trap 'forward INT' INT
# Job control: without it bash starts background commands with SIGINT ignored, and a signal
# ignored on entry cannot be trapped again, so run.sh (and the listener) would never see the
# SIGINT that stops them.
set -m

# start NAME=VALUE... -- COMMAND...: the listener in the background, its output filtered.
start() {
  rm -f "$state/out"
  mkfifo "$state/out"
  filter_output <"$state/out" &
  filter=$!
  (exec_clean "$@") >"$state/out" 2>&1 &
  listener=$!
}

# wait_listener: waits for the listener, whatever signals arrive, and sets $rc.
wait_listener() {
  rc=0
  while :; do
    wait "$listener" && rc=0 || rc=$?
    # A trapped signal interrupts wait with a status above 128 while the child still runs.
    kill -0 "$listener" 2>/dev/null || break
  done
  wait "$filter" || true
  listener=
}

# Microseconds on the wall clock. bash's SECONDS counts whole seconds since the shell started,
# so a deadline SECONDS + 1 could come a moment later, at the next whole second; with
# EPOCHREALTIME (bash >= 5.0; its decimal point follows the locale) a timeout is never short.
now_us() {
  if [[ -n ${EPOCHREALTIME:-} ]]; then
    printf '%s' "${EPOCHREALTIME/[.,]/}"
  else
    printf '%s' "$((SECONDS * 1000000))"
  fi
}

# A Runner.Worker process below the listener: a job is executing right now. argv[0] is read
# from /proc (a stand-in started with `exec -a Runner.Worker` looks the same), and only
# descendants of our listener count.
worker_running() {
  local dir argv0 pid stat ppid
  for dir in /proc/[0-9]*; do
    argv0=
    { IFS= read -r -d '' argv0 <"$dir/cmdline"; } 2>/dev/null || true
    [[ ${argv0##*/} == Runner.Worker ]] || continue
    pid=${dir#/proc/}
    while ((pid > 1)); do
      { stat=$(<"/proc/$pid/stat"); } 2>/dev/null || break
      # "pid (comm) state ppid …": comm may hold spaces and parentheses, so cut at the last ")".
      stat=${stat##*) }
      read -r _ ppid _ <<<"$stat"
      [[ $ppid =~ ^[0-9]+$ ]] || break
      [[ $ppid == "$listener" ]] && return 0
      pid=$ppid
    done
  done
  return 1
}

# The listener's failure code as our exit code: ours (2, 3, 4) are never reused.
failure() {
  local code=$1
  case $code in 0 | 2 | 3 | 4) code=1 ;; esac
  exit "$code"
}

# ---- GitHub ----

if [[ $forge == github ]]; then
  cd "$runner_home"
  # Ephemeral and JIT runners keep no settings between runs; RUNNER_MANUALLY_TRAP_SIG makes
  # run.sh pass SIGINT/SIGTERM on to the listener as SIGINT and return its code instead of
  # always 0 (src/Misc/layoutroot/run.sh, runWithManualTrap; the official image sets it,
  # images/Dockerfile). A too-old runner then exits 7 instead of 0.
  base=(RUNNER_MANUALLY_TRAP_SIG=1 ACTIONS_RUNNER_RETURN_VERSION_DEPRECATED_EXIT_CODE=1)
  if [[ $kind == registration ]]; then
    # The token goes to config.sh as ACTIONS_RUNNER_INPUT_TOKEN: the listener reads any
    # --arg from ACTIONS_RUNNER_INPUT_<ARG> and removes it from its environment
    # (src/Runner.Listener/CommandSettings.cs), so it is on no command line.
    # --disableupdate: an update would restart the listener mid-life (BRIEF lesson 8).
    # --no-default-labels: exactly the bucket's labels, so it takes only the jobs counted for it.
    (exec_clean ACTIONS_RUNNER_INPUT_TOKEN="$registration_token" -- ./config.sh --unattended \
      --url "$repo_url" --name "$runner_name" --labels "${labels:-self-hosted}" \
      --no-default-labels --work "$work" --ephemeral --disableupdate) ||
      failure $?
    registration_token=
    [[ -z $signalled ]] || die 3 "stopped before any job was assigned"
    start "${base[@]}" -- ./run.sh
  else
    # A JIT config holds the runner's work folder as the daemon minted it (default _work,
    # under the runner's directory): point that at our work directory in the allocation.
    [[ -e _work ]] || ln -s "$work" _work 2>/dev/null || log "could not link _work to $work"
    # `run.sh --jitconfig X` would put the config on every command line of run.sh,
    # run-helper.sh and Runner.Listener; ACTIONS_RUNNER_INPUT_JITCONFIG is read the same way
    # (CommandSettings.GetJitConfig → GetArg → the environment) and removed from the
    # listener's environment before any job.
    start "${base[@]}" ACTIONS_RUNNER_INPUT_JITCONFIG="$jitconfig" -- ./run.sh
    jitconfig=
  fi

  deadline=$(($(now_us) + idle_s * 1000000)) stopped_idle='' seen_job=''
  while kill -0 "$listener" 2>/dev/null; do
    if [[ -e $state/job ]] || worker_running; then
      seen_job=1
    elif [[ -z $stopped_idle && -z $signalled ]] && (($(now_us) >= deadline)); then
      # Checked again at the moment of stopping: a job that just arrived keeps the runner.
      if ! worker_running && [[ ! -e $state/job ]]; then
        log "no job assigned in $idle_timeout; stopping the runner (SIGINT)"
        stopped_idle=1
        # SIGINT is the listener's Ctrl-C: it ends its message loop, deletes its session and
        # exits 0 (src/Runner.Listener/Runner.cs). It does not delete the registration: an
        # ephemeral or JIT registration stays offline until runner-scaler's stale sweep (app
        # mode) or GitHub's own removal of offline ephemeral runners deletes it.
        kill -s INT "$listener" 2>/dev/null || true
      fi
    fi
    sleep 0.5 &
    wait $! || true
  done
  wait_listener
  [[ -e $state/job ]] && seen_job=1
  code=$(cat "$state/listener-code" 2>/dev/null || true)
  if [[ -n $seen_job ]]; then
    [[ $rc == 0 && -z $code ]] && exit 0
    log "the runner failed after taking a job (exit ${code:-$rc})"
    failure "${code:-$rc}"
  fi
  [[ -n $code ]] && {
    log "the runner failed before taking a job (listener exit $code)"
    failure "$code"
  }
  if [[ -z $stopped_idle && -z $signalled && $rc != 0 ]]; then
    log "the runner failed before taking a job (exit $rc)"
    failure "$rc"
  fi
  log "no job was assigned to this runner"
  exit 3
fi

# ---- Forgejo ----

instance=${repo_url%/*/*}
# Bare labels from the queue become <label>:host: the job runs inside this container, which is
# the isolation. Use <label>:docker://IMAGE only with a Docker daemon of the task's own.
forgejo_labels=
IFS=, read -r -a label_list <<<"${labels:-self-hosted}"
for label in "${label_list[@]}"; do
  [[ $label == *:* ]] || label="$label:host"
  forgejo_labels+=${forgejo_labels:+,}$label
done
state_dir=$work/.runner-state
mkdir -p "$state_dir"
chmod 700 "$state_dir"
cd "$state_dir"
# Its settings file: the registration and the job's work directories in this allocation
# (host.workdir_parent; forgejo-runner fills every other field with its defaults).
printf 'runner:\n  file: %s\nhost:\n  workdir_parent: %s\n' "$state_dir/.runner" "$work" >config.yml

if [[ $kind == runner ]]; then
  # The .runner file forgejo-runner reads (internal/pkg/config/registration.go): the runner
  # the daemon registered (Forgejo 15 POST …/actions/runners answers {id, uuid, token}).
  json_labels=
  for label in "${label_list[@]}"; do
    [[ $label == *:* ]] || label="$label:host"
    json_labels+=${json_labels:+,}\"$label\"
  done
  (
    umask 077
    printf '{"WARNING":"written by runner-scaler'\''s entrypoint","id":0,"uuid":"%s","name":"%s","token":"%s","address":"%s","labels":[%s]}\n' \
      "$runner_uuid" "$runner_name" "$runner_secret" "$instance" "$json_labels" >.runner
  )
  runner_uuid='' runner_secret=''
else
  # The shared registration token: forgejo-runner takes it only as a flag, so it is on this
  # command line for the moment of registration, before any job exists.
  (exec_clean -- "$forgejo_runner" register -c config.yml --no-interactive --instance "$instance" \
    --token "$registration_token" --name "$runner_name" --labels "$forgejo_labels") ||
    failure $?
  registration_token=
fi
[[ -z $signalled ]] || die 3 "stopped before any job was assigned"

# `one-job` (forgejo-runner ≥ 6.1.0, internal/app/cmd/job.go) asks once for a task, runs it
# and exits; with none waiting it exits with "could not fetch task". So ask again until a task
# is taken or the idle timeout has passed.
deadline=$(($(now_us) + idle_s * 1000000))
while :; do
  rm -f "$state/no-task"
  start -- "$forgejo_runner" one-job -c config.yml
  wait_listener
  if [[ -e $state/job ]]; then
    [[ $rc == 0 ]] && exit 0
    log "the runner failed after taking a job (exit $rc)"
    failure "$rc"
  fi
  if [[ -n $signalled ]]; then
    log "stopped before any job was assigned"
    exit 3
  fi
  if [[ ! -e $state/no-task ]]; then
    log "the runner failed before taking a job (exit $rc)"
    failure "$rc"
  fi
  if (($(now_us) >= deadline)); then
    log "no job assigned in $idle_timeout; exiting"
    exit 3
  fi
  sleep 2 &
  wait $! || true
  [[ -n $signalled ]] && {
    log "stopped before any job was assigned"
    exit 3
  }
done
