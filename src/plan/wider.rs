//! Runners of a wider label set serve narrower jobs.
//!
//! GitHub and Forgejo give a job to any runner whose labels include all of the job's. A
//! runner whose own job was cancelled (or taken by another runner) is still on its way to
//! serve whatever it can take; if a narrower job of the same repo is queued, it takes that
//! one. Dispatching a new runner for the narrower job beside it leaves one of the two with
//! nothing to do, and that one is wasted. So the planner counts such runners for the
//! narrower bucket and takes them out of their own bucket's surplus.

use super::index::{Bucket, LabelSets};

/// Per bucket (by index): how many of its missing runners a wider bucket's runners cover,
/// and how many of its runners are counted for a narrower bucket.
pub(super) struct Cover {
    pub covered: Vec<u32>,
    pub lent: Vec<u32>,
}

/// Lends runners within each repo. `order` lists bucket indices in key order (repo, then
/// label set), so a repo's buckets are contiguous and the result does not depend on the
/// order buckets were first seen in: narrower buckets borrow in that order, from wider
/// buckets in that order.
pub(super) fn cover_from_wider(buckets: &[Bucket], order: &[usize], labels: &LabelSets) -> Cover {
    let mut cover = Cover {
        covered: vec![0; buckets.len()],
        lent: vec![0; buckets.len()],
    };
    for repo in order.chunk_by(|a, b| buckets[*a].repo == buckets[*b].repo) {
        if repo.len() < 2
            || !repo.iter().any(|b| buckets[*b].deficit() > 0)
            || !repo.iter().any(|b| buckets[*b].lendable() > 0)
        {
            continue;
        }
        let mut lendable: Vec<u32> = repo.iter().map(|b| buckets[*b].lendable()).collect();
        let wider = |narrow: usize, wide: usize| {
            narrow != wide
                && labels
                    .get(buckets[repo[narrow]].labels)
                    .is_subset(labels.get(buckets[repo[wide]].labels))
        };
        // A claimed job none of its own bucket's children account for may run on a wider
        // runner of ours that only looks idle: that runner is not lent.
        for claimed in 0..repo.len() {
            let mut withheld = buckets[repo[claimed]].unattributed_claims();
            for (wide, room) in lendable.iter_mut().enumerate() {
                if withheld == 0 {
                    break;
                }
                if wider(claimed, wide) {
                    let take = withheld.min(*room);
                    *room -= take;
                    withheld -= take;
                }
            }
        }
        for narrow in 0..repo.len() {
            let mut short = buckets[repo[narrow]].deficit();
            for (wide, room) in lendable.iter_mut().enumerate() {
                if short == 0 {
                    break;
                }
                if *room > 0 && wider(narrow, wide) {
                    let take = short.min(*room);
                    *room -= take;
                    short -= take;
                    cover.covered[repo[narrow]] += take;
                    cover.lent[repo[wide]] += take;
                }
            }
        }
    }
    cover
}
