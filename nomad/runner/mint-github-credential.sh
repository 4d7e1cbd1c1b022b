#!/usr/bin/env bash
# vault mode's prestart task: mint this runner's own GitHub credential with the repo's admin
# token and leave only that credential for the runner task, in the shared allocation directory.
#
#   REPO_URL                 https://HOST/OWNER/REPO of the one repo this parent job serves,
#                            written in the job file, NEVER from dispatch meta: the admin token
#                            is sent to its host (or to GITHUB_API_URL)
#   DISPATCHED_REPO_URL      the dispatch's repo_url meta; only compared with REPO_URL
#   RUNNER_NAME, RUNNER_LABELS   dispatch meta, as for the entrypoint
#   GITHUB_AUTH_HEADER_FILE  a file holding "Authorization: Bearer <admin token>" (a template
#                            from Vault); curl reads it, so the token is on no command line
#   RUNNER_CREDENTIAL_FILE   where the credential goes (the runner task reads and deletes it)
#   GITHUB_API_URL           optional, from the job file too: the API address, when it is not
#                            derived from REPO_URL
#   MINT_CREDENTIAL          jit (default): a JIT config, single-use and bound to this runner's
#                            name and labels; registration: a registration token (an hour long,
#                            good for any number of registrations), for GitHub Enterprise Server
#                            releases without JIT
#
# Exit 2 for bad settings (a dispatch for another repo among them), 1 when GitHub refuses.
set -euo pipefail

log() { printf 'mint-github-credential: %s\n' "$*" >&2; }

# Nomad leaves an unset meta key's ${NOMAD_META_x} uninterpolated: that counts as missing.
# shellcheck disable=SC2016 # the literal text, not an expansion
uninterpolated='${'
for name in REPO_URL DISPATCHED_REPO_URL RUNNER_NAME GITHUB_AUTH_HEADER_FILE RUNNER_CREDENTIAL_FILE; do
  value=${!name:-}
  if [[ -z $value || $value == *"$uninterpolated"* ]]; then
    log "missing setting $name"
    exit 2
  fi
done
labels=${RUNNER_LABELS:-self-hosted}
[[ $labels == *"$uninterpolated"* ]] && labels=self-hosted

if [[ ! $REPO_URL =~ ^https://[^/]+/[^/]+/[^/]+$ ]]; then
  log "REPO_URL '$REPO_URL' is not https://HOST/OWNER/REPO"
  exit 2
fi
# Whoever may dispatch this job chooses the meta; the job file chose REPO_URL, so where the
# admin token goes is not the dispatcher's choice. A dispatch for another repo still gets no
# credential and no request is sent: its runner would register with this repo while the daemon
# counts it for the other, and exit 2 (a failed start) makes the mismatch visible instead.
# GitHub's hosts and repo names compare case-insensitively; a trailing / is not another repo.
normalise() {
  local url=${1%/}
  printf '%s' "${url,,}"
}
if [[ $(normalise "$DISPATCHED_REPO_URL") != "$(normalise "$REPO_URL")" ]]; then
  log "refusing to mint: dispatched for repo_url '$DISPATCHED_REPO_URL', but this job serves '$REPO_URL'"
  exit 2
fi

# https://github.com/owner/repo → the API of that host and owner/repo (REPO_URL is the job
# file's, so the host is too).
host=${REPO_URL#https://}
host=${host%%/*}
repo=${REPO_URL#https://*/}
case $host in
  github.com) api=https://api.github.com ;;
  *.ghe.com) api=https://api.$host ;;
  *) api=https://$host/api/v3 ;;
esac
# GITHUB_API_URL (the daemon's setting of the same name) overrides the derived API address.
api=${GITHUB_API_URL:-$api}

umask 077
answer=$(mktemp)
trap 'rm -f "$answer"' EXIT
request() {
  curl -sS -o "$answer" -w '%{http_code}' -X POST \
    -H @"$GITHUB_AUTH_HEADER_FILE" \
    -H "Accept: application/vnd.github+json" \
    -H "X-GitHub-Api-Version: 2022-11-28" \
    "$@"
}

case ${MINT_CREDENTIAL:-jit} in
  jit)
    # POST …/actions/runners/generate-jitconfig (API-CONTRACTS 1.5): runner_group_id 1 is the
    # default group; work_folder _work is what the entrypoint links to the allocation's work
    # directory.
    body=$(jq -cn --arg name "$RUNNER_NAME" --arg labels "$labels" \
      '{name: $name, runner_group_id: 1, labels: ($labels | split(",")), work_folder: "_work"}')
    status=$(request -H "Content-Type: application/json" -d "$body" \
      "$api/repos/$repo/actions/runners/generate-jitconfig")
    field=.encoded_jit_config
    ;;
  registration)
    status=$(request "$api/repos/$repo/actions/runners/registration-token")
    field=.token
    ;;
  *)
    log "MINT_CREDENTIAL must be jit or registration"
    exit 2
    ;;
esac
if [[ $status != 201 ]]; then
  # GitHub's error bodies carry a message and a documentation link, never a credential.
  log "GitHub answered $status: $(jq -r '.message // empty' "$answer" 2>/dev/null || true)"
  exit 1
fi
jq -er "$field" "$answer" >"$RUNNER_CREDENTIAL_FILE"
chmod 0400 "$RUNNER_CREDENTIAL_FILE"
log "minted a ${MINT_CREDENTIAL:-jit} credential for $RUNNER_NAME"
