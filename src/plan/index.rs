//! Dense indices for the planner's hot loops.
//!
//! A tick can carry a thousand repos, ten thousand jobs and thousands of children. Keyed by
//! `RepoName` and `BucketKey` in ordered maps, every job and child cost several string
//! comparisons and allocations, and planning took tens of milliseconds. Here each repo,
//! label set and bucket gets a small integer the first time it is seen, counts live in
//! `Vec`s, every distinct raw label list is parsed once, and the order the plan reports
//! buckets in (repo, then label set) is restored at the end by ranking the few distinct
//! repos and label sets.

use std::collections::HashMap;
use std::hash::Hash;

use chrono::{DateTime, Utc};

use crate::config::{Config, RepoConfig};
use crate::model::{LabelRejection, LabelSet, RepoName};
use crate::observe::Gap;

/// Hands out dense indices, first seen first; `ranks` gives each index its place in key order.
struct Interner<K> {
    items: Vec<K>,
    index: HashMap<K, usize>,
}

impl<K: Clone + Hash + Eq + Ord> Interner<K> {
    fn new() -> Self {
        Interner {
            items: Vec::new(),
            index: HashMap::new(),
        }
    }

    fn intern(&mut self, key: K) -> usize {
        if let Some(&i) = self.index.get(&key) {
            return i;
        }
        let i = self.items.len();
        self.items.push(key.clone());
        self.index.insert(key, i);
        i
    }

    /// `ranks()[i]` is the position of item `i` among all items in key order.
    fn ranks(&self) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.items.len()).collect();
        order.sort_unstable_by(|a, b| self.items[*a].cmp(&self.items[*b]));
        let mut ranks = vec![0; order.len()];
        for (rank, i) in order.into_iter().enumerate() {
            ranks[i] = rank;
        }
        ranks
    }
}

/// What the planner keeps per repo: the document's repos first, then any repo seen only in
/// the snapshot (a queue read for it, or children of a repo that left the document).
pub(super) struct RepoSlot<'a> {
    pub name: &'a RepoName,
    pub config: Option<&'a RepoConfig>,
    /// Why its queue could not be read this tick, if it could not.
    pub queue_gap: Option<&'a Gap>,
    /// Our in-flight children attributed to the repo.
    pub in_flight: u32,
    /// Our in-flight children per profile, by index into the config's `profiles`.
    pub profile_in_flight: Vec<u32>,
}

pub(super) struct Repos<'a> {
    ids: Interner<&'a RepoName>,
    pub slots: Vec<RepoSlot<'a>>,
}

impl<'a> Repos<'a> {
    pub fn new(config: &'a Config) -> Self {
        let mut repos = Repos {
            ids: Interner::new(),
            slots: Vec::with_capacity(config.repos.len()),
        };
        for (name, repo) in &config.repos {
            repos.intern(name);
            let slot = repos.slots.last_mut().expect("just interned");
            slot.config = Some(repo);
            slot.profile_in_flight = vec![0; repo.profiles.len()];
        }
        repos
    }

    /// The slot of `name`. A repo not interned by `new` is not in the document.
    pub fn intern(&mut self, name: &'a RepoName) -> usize {
        let id = self.ids.intern(name);
        if id == self.slots.len() {
            self.slots.push(RepoSlot {
                name,
                config: None,
                queue_gap: None,
                in_flight: 0,
                profile_in_flight: Vec::new(),
            });
        }
        id
    }

    pub fn ranks(&self) -> Vec<usize> {
        self.ids.ranks()
    }
}

/// Label sets, each parsed once per distinct raw form.
pub(super) struct LabelSets<'a> {
    ids: Interner<LabelSet>,
    /// A job's raw `runs-on` list → its label set, or why it was refused.
    raw: HashMap<&'a [String], Result<usize, LabelRejection>>,
    /// A child's `labels` meta → its label set, if it parses.
    meta: HashMap<&'a str, Option<usize>>,
}

impl<'a> LabelSets<'a> {
    pub fn new() -> Self {
        LabelSets {
            ids: Interner::new(),
            raw: HashMap::new(),
            meta: HashMap::new(),
        }
    }

    /// The label set of a job's raw labels, as [`LabelSet::parse`] would give it.
    pub fn of_job(&mut self, raw: &'a [String]) -> Result<usize, LabelRejection> {
        if let Some(known) = self.raw.get(raw) {
            return known.clone();
        }
        let parsed = LabelSet::parse(raw).map(|set| self.ids.intern(set));
        self.raw.insert(raw, parsed.clone());
        parsed
    }

    /// The label set of a child's `labels` meta, as [`LabelSet::from_meta`] would give it.
    pub fn of_meta(&mut self, meta: &'a str) -> Option<usize> {
        if let Some(known) = self.meta.get(meta) {
            return *known;
        }
        let parsed = LabelSet::from_meta(meta)
            .ok()
            .map(|set| self.ids.intern(set));
        self.meta.insert(meta, parsed);
        parsed
    }

    pub fn get(&self, id: usize) -> &LabelSet {
        &self.ids.items[id]
    }

    pub fn ranks(&self) -> Vec<usize> {
        self.ids.ranks()
    }
}

/// Demand and supply of one bucket (repo, label set).
#[derive(Default)]
pub(super) struct Bucket {
    pub repo: usize,
    pub labels: usize,
    /// Our in-flight children of the bucket.
    pub supply: u32,
    /// (when queued, job id) of each queued job.
    pub queued: Vec<(DateTime<Utc>, u64)>,
    pub in_progress: u32,
    /// Forgejo jobs claimed by a runner it does not name.
    pub claimed: u32,
}

#[derive(Default)]
pub(super) struct Buckets {
    index: HashMap<(usize, usize), usize>,
    pub all: Vec<Bucket>,
}

impl Buckets {
    pub fn get_or_insert(&mut self, repo: usize, labels: usize) -> usize {
        *self.index.entry((repo, labels)).or_insert_with(|| {
            self.all.push(Bucket {
                repo,
                labels,
                supply: 0,
                queued: Vec::new(),
                in_progress: 0,
                claimed: 0,
            });
            self.all.len() - 1
        })
    }
}
