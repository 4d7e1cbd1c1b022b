terraform {
  required_version = ">= 1.5"

  required_providers {
    consul = {
      source  = "hashicorp/consul"
      version = ">= 2.20"
    }
    vault = {
      source  = "hashicorp/vault"
      version = ">= 4.0"
    }
    nomad = {
      source  = "hashicorp/nomad"
      version = ">= 2.1"
    }
  }
}

# Addresses and tokens come from the providers' standard environment variables
# (CONSUL_HTTP_ADDR/CONSUL_HTTP_TOKEN, VAULT_ADDR/VAULT_TOKEN, NOMAD_ADDR/NOMAD_TOKEN), so no
# credential is written into this configuration or its state inputs.
provider "consul" {}
provider "vault" {}
provider "nomad" {}
