# What the Nomad job files need from this configuration.

# The daemon's job is pinned to the nodes whose sessions its Consul policy may write (consul.tf):
#   nomad job run -var "daemon_nodes=$(terraform -chdir=terraform output -json daemon_nodes)" \
#     … nomad/runner-scaler.nomad.hcl
# (a list-typed job variable takes an HCL expression, and JSON's list is one).
output "daemon_nodes" {
  description = "The daemon's job variable daemon_nodes: the nodes it may run on and create its lock session from."
  value       = var.daemon_nodes
}
