//! Every port one controller runs on, in one bundle: per forge kind its queue, registrar
//! and registries, and Nomad's children and control. The leader's fence wraps the bundle
//! (`crate::leader::fenced`); the controller only ever sees it.

use std::sync::Arc;

use crate::act::{
    ChildControl, CredentialWrapper, RegisteredRunners, Registrar, Registrars, RunnerRegistry,
};
use crate::config::Mode;
use crate::observe::{ChildSource, QueueSource};

/// The clients of one forge kind.
pub struct Forge {
    pub queue: Arc<dyn QueueSource>,
    pub registrar: Arc<dyn Registrar>,
    /// Runner registrations the daemon may read and delete (GitHub `app` mode); `None` where
    /// it has no such API, so a runner whose allocation runs is never stopped.
    pub runners: Option<Arc<dyn RunnerRegistry>>,
    /// Runners the daemon registered per dispatch and deletes once their child is purged
    /// (Forgejo 15 and later).
    pub registered: Option<Arc<dyn RegisteredRunners>>,
}

/// Every port the loop uses.
pub struct Services {
    /// Repos in `app` and `vault` mode.
    pub github: Option<Forge>,
    /// Repos in `forgejo` mode.
    pub forgejo: Option<Forge>,
    pub children: Arc<dyn ChildSource>,
    pub control: Arc<dyn ChildControl>,
    /// Vault response wrapping for credentials in dispatch meta; `None` without Vault.
    pub wrapper: Option<Arc<dyn CredentialWrapper>>,
}

impl Services {
    /// Every port, from one client per service: a GitHub and a Forgejo client (each a queue
    /// and a registrar) and a Nomad client.
    pub fn of<G, F, N>(github: Arc<G>, forgejo: Arc<F>, nomad: Arc<N>) -> Services
    where
        G: QueueSource + Registrar + RunnerRegistry + 'static,
        F: QueueSource + Registrar + RegisteredRunners + 'static,
        N: ChildSource + ChildControl + 'static,
    {
        Services {
            github: Some(Forge {
                queue: github.clone(),
                registrar: github.clone(),
                runners: Some(github),
                registered: None,
            }),
            forgejo: Some(Forge {
                queue: forgejo.clone(),
                registrar: forgejo.clone(),
                runners: None,
                registered: Some(forgejo),
            }),
            children: nomad.clone(),
            control: nomad,
            wrapper: None,
        }
    }

    /// Wraps every credential with `wrapper` before it goes into dispatch meta.
    pub fn with_wrapper(mut self, wrapper: Arc<dyn CredentialWrapper>) -> Services {
        self.wrapper = Some(wrapper);
        self
    }

    pub fn forge(&self, mode: &Mode) -> Option<&Forge> {
        if mode.is_github() {
            self.github.as_ref()
        } else {
            self.forgejo.as_ref()
        }
    }
}

impl Registrars for Services {
    fn for_mode(&self, mode: &Mode) -> Option<&dyn Registrar> {
        self.forge(mode).map(|f| f.registrar.as_ref())
    }

    fn runners_for(&self, mode: &Mode) -> Option<&dyn RunnerRegistry> {
        self.runner_registry(mode).map(|r| r.as_ref())
    }

    fn wrapper(&self) -> Option<&dyn CredentialWrapper> {
        self.wrapper.as_deref()
    }

    fn registered_runners(&self, mode: &Mode) -> Option<&dyn RegisteredRunners> {
        self.forge(mode).and_then(|f| f.registered.as_deref())
    }
}

impl Services {
    /// The runner registry of `mode`'s repos. Only `app` mode holds `administration: write`
    /// on the repo; a polling token may not delete registrations, and Forgejo has no such API
    /// before 15.
    pub fn runner_registry(&self, mode: &Mode) -> Option<&Arc<dyn RunnerRegistry>> {
        if !matches!(mode, Mode::App) {
            return None;
        }
        self.forge(mode).and_then(|f| f.runners.as_ref())
    }
}

/// The daemon's state key (`control_loop::carried`): read at the start of a term, written by
/// the lock holder when what it carries changes.
#[async_trait::async_trait]
pub trait CarriedStore: Send + Sync {
    /// The key's value; `None` when the key does not exist.
    async fn load(&self) -> Result<Option<Vec<u8>>, crate::model::PortError>;
    async fn save(&self, value: Vec<u8>) -> Result<(), crate::model::PortError>;
}
