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
use std::hash::{BuildHasher, BuildHasherDefault, Hash, Hasher, RandomState};

use chrono::{DateTime, Utc};

use crate::config::{Config, RepoConfig};
use crate::model::{LabelRejection, LabelSet, RepoName};
use crate::observe::Gap;

/// Hands out dense indices, first seen first; `ranks` gives each index its place in key order.
struct Interner<K, S = RandomState> {
    items: Vec<K>,
    index: HashMap<K, usize, S>,
}

impl<K: Clone + Hash + Eq + Ord, S: BuildHasher + Default> Interner<K, S> {
    fn new() -> Self {
        Interner {
            items: Vec::new(),
            index: HashMap::default(),
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
        // The document's repos are interned first, in order; usually no other repo follows.
        if self.items.is_sorted() {
            return (0..self.items.len()).collect();
        }
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
    /// When its queue reading was taken, if not this tick (carried from an earlier poll).
    pub read_earlier_at: Option<chrono::DateTime<chrono::Utc>>,
    /// The first of its parents whose children could not be listed, as a message.
    pub parent_gap: Option<String>,
    /// Our in-flight children attributed to the repo.
    pub in_flight: u32,
    /// Our in-flight children per profile, by index into the config's `profiles`.
    pub profile_in_flight: Vec<u32>,
}

pub(super) struct Repos<'a> {
    /// Repo names are the document's (the snapshot's repos and `repo_urls` are keyed by
    /// them), so the operator chose them and the quick hasher is safe.
    ids: Interner<&'a RepoName, BuildHasherDefault<TrustedKeyHasher>>,
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
                read_earlier_at: None,
                parent_gap: None,
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

/// Label sets, each job's parsed once per distinct raw form.
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

/// Where one repo's jobs go, by their raw `runs-on` list. A repo's jobs mostly share a
/// handful of lists: comparing a job's short list with the first few seen is cheaper than
/// hashing it and then its bucket; lists beyond those take the hashed way every time.
pub(super) struct JobsOfRepo<'a> {
    repo: usize,
    seen: Vec<SeenLabels<'a>>,
}

struct SeenLabels<'a> {
    raw: &'a [String],
    labels: Result<usize, LabelRejection>,
    /// The bucket (this repo, these labels), once a job has needed it.
    bucket: Option<usize>,
}

/// A job's label set, and where its list sits among those seen.
#[derive(Clone, Copy)]
pub(super) struct JobLabels {
    labels: usize,
    seen: Option<usize>,
}

impl<'a> JobsOfRepo<'a> {
    /// A handful: enough for a repo's usual few `runs-on` lists, short enough to scan.
    const KEPT: usize = 8;

    pub fn new(repo: usize) -> Self {
        JobsOfRepo {
            repo,
            seen: Vec::new(),
        }
    }

    /// The label set of a job's raw labels, as [`LabelSet::parse`] would give it.
    pub fn labels(
        &mut self,
        raw: &'a [String],
        label_sets: &mut LabelSets<'a>,
    ) -> Result<JobLabels, LabelRejection> {
        let position = self.seen.iter().position(|seen| seen.raw == raw);
        let (labels, seen) = match position {
            Some(i) => (self.seen[i].labels.clone(), Some(i)),
            None => {
                let labels = label_sets.of_job(raw);
                let kept = (self.seen.len() < Self::KEPT).then(|| {
                    self.seen.push(SeenLabels {
                        raw,
                        labels: labels.clone(),
                        bucket: None,
                    });
                    self.seen.len() - 1
                });
                (labels, kept)
            }
        };
        labels.map(|labels| JobLabels { labels, seen })
    }

    /// The bucket of this repo's jobs with `labels`, made when first needed.
    pub fn bucket(&mut self, labels: JobLabels, buckets: &mut Buckets) -> usize {
        let Some(seen) = labels.seen else {
            return buckets.get_or_insert(self.repo, labels.labels);
        };
        *self.seen[seen]
            .bucket
            .get_or_insert_with(|| buckets.get_or_insert(self.repo, labels.labels))
    }
}

/// Demand and supply of one bucket (repo, label set).
#[derive(Clone, Copy)]
pub(super) struct Bucket {
    pub repo: usize,
    pub labels: usize,
    /// Our in-flight children of the bucket.
    pub supply: u32,
    /// Those of them whose allocation runs.
    pub placed: u32,
    /// Its queued jobs, which [`QueuedJobs`] holds.
    pub queued: u32,
    pub in_progress: u32,
    /// Forgejo jobs claimed by a runner it does not name.
    pub claimed: u32,
    /// In-flight children whose registration the daemon deleted and no job in progress
    /// names: not in `supply`, still under the caps.
    pub retiring: u32,
    /// Children stopped whose allocation still runs (inside `kill_timeout`): not in
    /// `supply`, still under the caps until Nomad reports the allocation ended.
    pub stopping: u32,
}

impl Bucket {
    /// Jobs running on the bucket's children. Forgejo names no runner on a job: a claimed
    /// job is assumed to run on one of its bucket's children, up to their number, so a job
    /// on someone else's runner never makes us dispatch. A child runs one job at a time, so
    /// however many jobs a forge says run on the bucket's children, no more than their
    /// number do.
    pub fn running(&self) -> u32 {
        (self.in_progress + self.claimed.min(self.supply)).min(self.supply)
    }

    /// Runners the bucket lacks for its own jobs.
    pub fn deficit(&self) -> u32 {
        (self.queued + self.running()).saturating_sub(self.supply)
    }

    /// Claimed jobs its own children cannot account for: they may run on a runner of a
    /// wider label set, which then only looks idle.
    pub fn unattributed_claims(&self) -> u32 {
        self.claimed.saturating_sub(self.supply)
    }

    /// Runners of the bucket with no job of its own to serve whose allocation runs: they can
    /// take a job of a narrower label set. An unplaced child cannot: it may never be placed
    /// (a profile whose nodes are gone), and a narrower job would wait on it.
    pub fn lendable(&self) -> u32 {
        let spare = self.supply.saturating_sub(self.queued + self.running());
        spare.min(self.placed.saturating_sub(self.running()))
    }
}

#[derive(Default)]
pub(super) struct Buckets {
    index: HashMap<(usize, usize), usize, BuildHasherDefault<TrustedKeyHasher>>,
    pub all: Vec<Bucket>,
}

/// Hashes keys that nobody outside can choose: the planner's own dense indices and the
/// document's repo names. Nobody can make those collide on purpose, so a multiply per word
/// does instead of SipHash, which was a fifth of the planner's time. Labels, URLs and runner
/// names come from workflow files and Nomad meta, and keep the default, keyed hasher.
#[derive(Default)]
pub(super) struct TrustedKeyHasher(u64);

impl Hasher for TrustedKeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for word in &mut words {
            self.write_u64(u64::from_le_bytes(word.try_into().expect("eight bytes")));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut word = [0; 8];
            word[..rest.len()].copy_from_slice(rest);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_usize(&mut self, word: usize) {
        self.write_u64(word as u64);
    }

    fn write_u64(&mut self, word: u64) {
        // The multiplier of FxHash: odd, with its bits spread, so that hashbrown's top-seven
        // bit tags differ for neighbouring indices.
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

impl Buckets {
    pub fn get_or_insert(&mut self, repo: usize, labels: usize) -> usize {
        *self.index.entry((repo, labels)).or_insert_with(|| {
            self.all.push(Bucket {
                repo,
                labels,
                supply: 0,
                placed: 0,
                queued: 0,
                in_progress: 0,
                claimed: 0,
                retiring: 0,
                stopping: 0,
            });
            self.all.len() - 1
        })
    }
}

/// Every queued job as (bucket, when queued, job id), in one `Vec` rather than one per bucket:
/// thousands of small growing `Vec`s cost more in allocation than the rest of the job loop.
#[derive(Default)]
pub(super) struct QueuedJobs(Vec<(usize, DateTime<Utc>, u64)>);

impl QueuedJobs {
    /// Counts the job in its bucket, too.
    pub fn push(&mut self, bucket: &mut Bucket, index: usize, queued_at: DateTime<Utc>, id: u64) {
        bucket.queued += 1;
        self.0.push((index, queued_at, id));
    }

    /// The jobs grouped by bucket (a counting sort on the buckets' counts).
    pub fn by_bucket(self, buckets: &[Bucket]) -> JobsByBucket {
        let mut starts = Vec::with_capacity(buckets.len() + 1);
        let mut next = 0;
        for bucket in buckets {
            starts.push(next);
            next += bucket.queued as usize;
        }
        starts.push(next);
        let mut fill = starts.clone();
        let mut jobs = vec![(DateTime::<Utc>::MIN_UTC, 0); next];
        for (bucket, queued_at, id) in self.0 {
            jobs[fill[bucket]] = (queued_at, id);
            fill[bucket] += 1;
        }
        JobsByBucket { jobs, starts }
    }
}

pub(super) struct JobsByBucket {
    jobs: Vec<(DateTime<Utc>, u64)>,
    /// Bucket `b`'s jobs are `jobs[starts[b]..starts[b + 1]]`.
    starts: Vec<usize>,
}

impl JobsByBucket {
    /// (when queued, job id) of each of the bucket's queued jobs.
    pub fn of(&mut self, bucket: usize) -> &mut [(DateTime<Utc>, u64)] {
        &mut self.jobs[self.starts[bucket]..self.starts[bucket + 1]]
    }
}

/// Bucket indices in key order (repo, then label set), from each repo's and each label set's
/// rank in key order (see [`Interner::ranks`]).
///
/// No two buckets share both ranks, so a counting sort by label set and then a stable one by
/// repo give exactly the order a comparison sort would, in time linear in the buckets rather
/// than n log n (see [`sort_by_time`]).
pub(super) fn in_key_order(
    buckets: &[Bucket],
    repo_ranks: &[usize],
    label_ranks: &[usize],
) -> Vec<usize> {
    let by_labels = counting_sort(0..buckets.len(), label_ranks.len(), |b| {
        label_ranks[buckets[b].labels]
    });
    counting_sort(by_labels.iter().copied(), repo_ranks.len(), |b| {
        repo_ranks[buckets[b].repo]
    })
}

/// `items` in the order of `key` (each below `keys`), those with equal keys in the order given.
fn counting_sort(
    items: impl Iterator<Item = usize> + Clone,
    keys: usize,
    key: impl Fn(usize) -> usize,
) -> Vec<usize> {
    // `next[k]`: where the next item of key `k` goes.
    let mut next = vec![0; keys + 1];
    for item in items.clone() {
        next[key(item) + 1] += 1;
    }
    for k in 1..=keys {
        next[k] += next[k - 1];
    }
    let mut sorted = vec![0; next[keys]];
    for item in items {
        let k = key(item);
        sorted[next[k]] = item;
        next[k] += 1;
    }
    sorted
}

/// Sorts the runners to plan, each `(seconds, nanoseconds, candidate)` of the job it would
/// serve, into exactly the order `sort_unstable` gives.
///
/// A comparison sort costs n log n: with [`in_key_order`]'s, it was the largest part of a
/// plan whose work grew faster than the plan's input, a sixth of its instructions at 100,000
/// queued jobs. The jobs queued in one tick were mostly queued within hours of each other
/// (GitHub cancels a job queued for a day), so the units are instead counted into one slot
/// per second, in linear time, and each second's few are then sorted among themselves. They
/// were pushed in candidate order and forges mostly give whole seconds, so a second's units
/// are usually in order already, which `sort_unstable` only checks. Should the seconds spread
/// wider than the units are many, the slots would cost more than they save: a plain sort.
pub(super) fn sort_by_time(units: &mut Vec<(i64, u32, usize)>) {
    let seconds = units.iter().map(|(s, _, _)| *s);
    let (Some(first), Some(last)) = (seconds.clone().min(), seconds.max()) else {
        return;
    };
    let spread = last.abs_diff(first);
    if spread >= (SLOTS_PER_UNIT * units.len()) as u64 {
        units.sort_unstable();
        return;
    }
    let slot = |s: i64| s.abs_diff(first) as usize;
    // `starts[k]`: where the units of second `first + k` begin.
    let mut starts = vec![0; spread as usize + 2];
    for (s, _, _) in units.iter() {
        starts[slot(*s) + 1] += 1;
    }
    for k in 1..starts.len() {
        starts[k] += starts[k - 1];
    }
    let mut next = starts.clone();
    let mut sorted = vec![(0, 0, 0); units.len()];
    for unit in units.iter() {
        let k = slot(unit.0);
        sorted[next[k]] = *unit;
        next[k] += 1;
    }
    for second in starts.windows(2) {
        sorted[second[0]..second[1]].sort_unstable();
    }
    *units = sorted;
}

/// How far apart, in seconds per unit, the units' times may spread before a plain sort is
/// cheaper than one counter per second.
const SLOTS_PER_UNIT: usize = 4;

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn bucket(repo: usize, labels: usize) -> Bucket {
        Bucket {
            repo,
            labels,
            supply: 0,
            placed: 0,
            queued: 0,
            in_progress: 0,
            claimed: 0,
            retiring: 0,
            stopping: 0,
        }
    }

    /// Units as the planner pushes them, candidate after candidate; the seconds are drawn from
    /// `0..spread`, so a narrow spread takes the slots and a wide one the plain sort.
    fn units(spread: i64) -> impl Strategy<Value = Vec<(i64, u32, usize)>> {
        prop::collection::vec(
            prop::collection::vec(
                (-spread..spread, prop::sample::select(&[0, 0, 7][..])),
                0..6,
            ),
            0..40,
        )
        .prop_map(|candidates| {
            let mut units = Vec::new();
            for (c, mut times) in candidates.into_iter().enumerate() {
                times.sort_unstable();
                units.extend(times.into_iter().map(|(s, n)| (s, n, c)));
            }
            units
        })
    }

    proptest! {
        #[test]
        fn sort_by_time_sorts_as_a_comparison_sort_does(
            mut units in prop_oneof![units(3), units(40), units(i64::MAX / 2)],
            shuffle in any::<bool>(),
        ) {
            if shuffle {
                units.reverse();
            }
            let mut expected = units.clone();
            expected.sort_unstable();
            sort_by_time(&mut units);
            prop_assert_eq!(units, expected);
        }

        #[test]
        fn in_key_order_orders_as_a_comparison_sort_does(
            keys in prop::collection::btree_set((0..30usize, 0..5usize), 0..60),
            seed in any::<u64>(),
        ) {
            // Buckets seen in some order, and ranks that are not the indices.
            let mut keys: Vec<_> = keys.into_iter().collect();
            let n = keys.len().max(1);
            keys.rotate_left(seed as usize % n);
            let buckets: Vec<Bucket> = keys.iter().map(|&(r, l)| bucket(r, l)).collect();
            let repo_ranks: Vec<usize> = (0..30).map(|r| (r * 7 + seed as usize) % 30).collect();
            let label_ranks = vec![3, 0, 4, 1, 2];
            let mut expected: Vec<usize> = (0..buckets.len()).collect();
            expected.sort_by_key(|&b| (repo_ranks[buckets[b].repo], label_ranks[buckets[b].labels]));
            prop_assert_eq!(in_key_order(&buckets, &repo_ranks, &label_ranks), expected);
        }
    }
}
