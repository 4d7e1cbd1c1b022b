# syntax=docker/dockerfile:1
#
# A Forgejo runner image that runs `uses:` actions, for nomad/forgejo-runner.nomad.hcl:
#   docker build -f nomad/runner/forgejo-runner.Dockerfile \
#     -t registry.example.com/forgejo-runner-node:11.3.1 nomad/runner
#   docker push registry.example.com/forgejo-runner-node:11.3.1
#   nomad job run -var image=registry.example.com/forgejo-runner-node:11.3.1 \
#     nomad/forgejo-runner.nomad.hcl
#
# Why: the runner job registers its labels as `<label>:host`, so every step runs inside the
# runner's own container. forgejo-runner (act) starts a JavaScript action such as
# actions/checkout with the `node` on that environment's PATH, and Forgejo's image has no Node:
# only `run:` steps work there. This image adds:
# - nodejs: Alpine's package (musl). Actions written in JavaScript run on it whatever Node
#   version their action.yml names (act runs the `node` it finds); actions that download
#   glibc binaries (many setup-* actions) still fail on Alpine: give those jobs another label
#   and another image.
# - curl and ca-certificates: the entrypoint then unwraps the runner's credential with curl,
#   which takes VAULT_CACERT (BusyBox wget takes no CA file). For a private CA you may also
#   COPY it to /usr/local/share/ca-certificates/ and RUN update-ca-certificates, so that the
#   steps' own tools trust it.
#
# Not a Docker daemon and no Docker socket: `docker://` labels stay unavailable by design (the
# host's socket would hand every workflow the node; see README, "The runner contract").

# The base is the job file's default image, the same release: move both pins together.
FROM code.forgejo.org/forgejo/runner:11.3.1

USER root
RUN apk add --no-cache nodejs curl ca-certificates
# Back to the image's own user (USER 1000:1000 in forgejo/runner's Dockerfile), the uid the
# job file's task and templates run as.
USER 1000:1000
