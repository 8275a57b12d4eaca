//! The scheduler, the engine loop's first part: it decides who runs. Each turn it places the
//! requests that arrived in lanes (the lane each pads least, or a new one for a request of a
//! very different length) within the key/value cache's budget, refusing what does not fit,
//! and writes down the turn's changes as a [`Plan`] — which a tensor-parallel engine's first
//! rank sends the others, so that every rank's batches change alike. Within a lane, the
//! slices of long prompts take their turns between decode steps (`Batch::step`).
//!
//! It knows the requests' sizes and the cache's budget, not the model's tensors nor the
//! callers: the executor (`executor.rs`) runs what it lets in, the output processor
//! (`output.rs`) answers.

use crate::comm::Comm;
use crate::request::{GenerateRequest, RequestId};
use crate::{Error, Result};

/// One turn of the engine's changes to its batches: the requests joining each lane (a lane
/// past the last is opened), the requests whose callers went away; then every busy lane
/// steps. What a tensor-parallel engine's first rank sends the others each turn.
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct Plan {
    pub joining: Vec<Vec<(RequestId, GenerateRequest)>>,
    pub gone: Vec<RequestId>,
}

/// The first rank's plan (`None`: stop) on every rank; the others pass `None`.
pub(crate) fn share_plan(ranks: &dyn Comm, plan: Option<&Plan>) -> Result<Option<Plan>> {
    let mine = if ranks.rank() == 0 {
        serde_json::to_vec(&plan).map_err(|e| Error::Comm(format!("cannot encode the engine's plan: {e}")))?
    } else {
        Vec::new()
    };
    let all = crate::comm::all_gather_bytes(ranks, &mine)?;
    serde_json::from_slice(&all[0]).map_err(|e| Error::Comm(format!("rank 0 sent an unreadable engine plan: {e}")))
}

/// What bounds the lanes: how many may decode side by side, and the bytes of keys and
/// values they may come to hold (`None`: unbounded), counted at `bytes_per_position`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LaneLimits {
    pub max_lanes: usize,
    pub kv_budget_bytes: Option<u64>,
    pub bytes_per_position: usize,
}

/// A turn's placement of requests in lanes.
pub(crate) struct Scheduler {
    limits: LaneLimits,
    /// Per lane: rows and longest extent, the requests placed this turn included.
    loads: Vec<(usize, usize)>,
    joining: Vec<Vec<(RequestId, GenerateRequest)>>,
}

impl Scheduler {
    /// A turn over lanes whose loads (`Batch::load`) are `loads`.
    pub fn new(loads: Vec<(usize, usize)>, limits: LaneLimits) -> Self {
        let joining = vec![Vec::new(); loads.len()];
        Scheduler { limits, loads, joining }
    }

    /// Place `request` (validated; `extent` cache positions) in a lane, or give the error
    /// that refuses it: [`Error::Busy`] when the work in flight holds the budget,
    /// [`Error::Input`] when it alone would pass it.
    pub fn place(&mut self, id: RequestId, request: GenerateRequest, extent: usize) -> Result<()> {
        let lane = admission(&self.loads, request.n, extent, &self.limits)?;
        if lane == self.loads.len() {
            self.loads.push((0, 0));
            self.joining.push(Vec::new());
        }
        self.loads[lane] = (self.loads[lane].0 + request.n, self.loads[lane].1.max(extent));
        self.joining[lane].push((id, request));
        Ok(())
    }

    /// The turn's plan, with the requests whose callers went away.
    pub fn plan(self, gone: Vec<RequestId>) -> Plan {
        Plan { joining: self.joining, gone }
    }
}

/// Cache buffers grow with room to spare (half their length again, `llama::reserve_kv`):
/// the budget counts them at that size.
fn budgeted_bytes(positions: usize, bytes_per_position: usize) -> u64 {
    (positions as u64 * 3 / 2 + 32) * bytes_per_position as u64
}

/// Choose a lane for a request of `rows` samples and `extent` positions, given the lanes'
/// loads `(rows, longest extent)`: the one it pads least, or a new lane when joining would
/// more than double what it adds by itself; then check the budget over every lane.
fn admission(loads: &[(usize, usize)], rows: usize, extent: usize, limits: &LaneLimits) -> Result<usize> {
    let bytes_per_position = limits.bytes_per_position;
    let added = |&(r, longest): &(usize, usize)| (r + rows) * longest.max(extent) - r * longest;
    let alone = rows * extent;
    let (mut lane, mut cost) =
        loads.iter().enumerate().map(|(i, load)| (i, added(load))).min_by_key(|&(_, c)| c).unwrap_or((0, alone));
    if loads.is_empty() || (cost > 2 * alone && loads.len() < limits.max_lanes.max(1)) {
        (lane, cost) = (loads.len(), alone);
    }
    let Some(budget) = limits.kv_budget_bytes else { return Ok(lane) };
    let alone_bytes = budgeted_bytes(alone, bytes_per_position);
    if alone_bytes > budget {
        return Err(Error::Input(format!(
            "the request needs {} MiB of key/value cache ({rows} samples × {extent} positions: prompt and \
             max_tokens), more than this engine's budget of {} MiB; ask for fewer samples, fewer max_tokens or a \
             shorter prompt",
            alone_bytes >> 20,
            budget >> 20
        )));
    }
    let now: usize = loads.iter().map(|(r, longest)| r * longest).sum();
    let total = budgeted_bytes(now + cost, bytes_per_position);
    if total > budget {
        return Err(Error::Busy(format!(
            "the requests in flight hold the key/value cache's budget ({} MiB of {} MiB with this one)",
            total >> 20,
            budget >> 20
        )));
    }
    Ok(lane)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_lanes: usize, kv_budget_bytes: Option<u64>, bytes_per_position: usize) -> LaneLimits {
        LaneLimits { max_lanes, kv_budget_bytes, bytes_per_position }
    }

    #[test]
    fn a_request_joins_the_lane_it_pads_least_or_opens_one() {
        let two = limits(2, None, 1);
        // One lane of 4 rows × 100: a request of 4 × 90 adds 360 there, fine.
        assert_eq!(admission(&[(4, 100)], 4, 90, &two).unwrap(), 0);
        // A 4,000-position request among short rows would pad them all: a lane of its own.
        assert_eq!(admission(&[(32, 100)], 1, 4000, &two).unwrap(), 1);
        // Not past max_lanes.
        assert_eq!(admission(&[(32, 100), (1, 4000)], 1, 8000, &two).unwrap(), 1);
        assert_eq!(admission(&[], 3, 10, &two).unwrap(), 0);
    }

    #[test]
    fn the_budget_refuses_what_does_not_fit_by_kind() {
        // Alone, 2 × 100 positions count (300 + 32) × 8 bytes = 2,656.
        let tight = limits(1, Some(2_000), 8);
        assert!(matches!(admission(&[], 2, 100, &tight), Err(Error::Input(_))));
        let some = limits(1, Some(4_000), 8);
        assert_eq!(admission(&[], 2, 100, &some).unwrap(), 0);
        assert!(matches!(admission(&[(2, 100)], 2, 100, &some), Err(Error::Busy(_))));
        // A turn's placements count against each other.
        let mut turn = Scheduler::new(vec![(0, 0)], some);
        let request = GenerateRequest { prompt: vec![1; 50], n: 2, sampling: Default::default() };
        turn.place(0, request.clone(), 100).unwrap();
        assert!(matches!(turn.place(1, request, 100), Err(Error::Busy(_))));
        assert_eq!(turn.plan(vec![7]).joining[0].len(), 1);
    }
}
