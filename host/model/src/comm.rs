//! The tensor-parallel seam: the collectives a sharded model needs, behind one trait.
//!
//! A model split over `size` ranks keeps `1/size` of each attention's heads and of each MLP's
//! intermediate width (column-parallel q/k/v, gate/up; row-parallel o, down), so every
//! block needs one all-reduce after attention and one after the MLP, and the vocabulary-split
//! output projection one all-gather. [`Solo`] is the single-rank case; [`ThreadComm`] runs
//! the ranks as threads of this process (CPU tests, and the shape NCCL fills on GPUs).

use crate::{Error, Result};
use candle_core::Tensor;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

/// Collectives across the ranks of one tensor-parallel group. Every rank calls each
/// collective in the same order with a tensor of the same shape.
pub trait Comm: Send + Sync + std::fmt::Debug {
    /// This rank, in `0..size`.
    fn rank(&self) -> usize;
    /// How many ranks the model is split over.
    fn size(&self) -> usize;
    /// The element-wise sum of every rank's `x`, on every rank.
    fn all_reduce_sum(&self, x: &Tensor) -> Result<Tensor>;
    /// Every rank's `x` concatenated along `dim` in rank order, on every rank.
    fn all_gather(&self, x: &Tensor, dim: usize) -> Result<Tensor>;
    /// The device this rank's collectives run on, where its model must live (an NCCL rank's
    /// GPU); `None`: any device (the collectives move what they are given).
    fn device(&self) -> Option<candle_core::Device> {
        None
    }
    /// `values` replaced, in place, by the element-wise sum of every rank's, added in rank
    /// order (bit-identical on every rank; NCCL: the same bits on every rank, its own order).
    /// For host buffers such as summed gradients; a transport may override it to skip the
    /// tensor round trip.
    fn all_reduce_sum_in_place(&self, values: &mut [f32]) -> Result<()> {
        if self.size() == 1 {
            return Ok(());
        }
        let tensor = Tensor::from_slice(values, values.len(), &candle_core::Device::Cpu)?;
        let summed: Vec<f32> = self.all_reduce_sum(&tensor)?.to_vec1()?;
        values.copy_from_slice(&summed);
        Ok(())
    }
}

/// Every rank's `bytes`, in rank order, on every rank (messages of any length: lengths go
/// first, then the messages padded to the longest, through `all_gather` of u8 tensors).
pub fn all_gather_bytes(comm: &dyn Comm, bytes: &[u8]) -> Result<Vec<Vec<u8>>> {
    if comm.size() == 1 {
        return Ok(vec![bytes.to_vec()]);
    }
    let device = candle_core::Device::Cpu;
    let length = u32::try_from(bytes.len()).map_err(|_| Error::Comm(format!("a message of {} bytes", bytes.len())))?;
    let lengths: Vec<u32> = comm.all_gather(&Tensor::new(&[length], &device)?, 0)?.to_vec1()?;
    let longest = lengths.iter().copied().max().unwrap_or(0) as usize;
    let mut padded = bytes.to_vec();
    padded.resize(longest.max(1), 0);
    let all: Vec<u8> = comm.all_gather(&Tensor::from_vec(padded, longest.max(1), &device)?, 0)?.to_vec1()?;
    Ok(lengths.iter().enumerate().map(|(rank, &n)| all[rank * longest.max(1)..][..n as usize].to_vec()).collect())
}

/// Every rank's tensor summed in rank order — on every rank the same additions in the same
/// order, so all ranks hold bit-identical results (ranks whose weights drifted apart by a
/// rounding would no longer take the same optimizer step).
pub fn sum_in_rank_order(all: Vec<Tensor>) -> Result<Tensor> {
    let mut parts = all.into_iter();
    let Some(mut sum) = parts.next() else { return Err(Error::Comm("a collective of no ranks".into())) };
    for part in parts {
        sum = (sum + part)?;
    }
    Ok(sum)
}

/// One rank: the collectives are identities.
#[derive(Clone, Copy, Debug, Default)]
pub struct Solo;

impl Comm for Solo {
    fn rank(&self) -> usize {
        0
    }

    fn size(&self) -> usize {
        1
    }

    fn all_reduce_sum(&self, x: &Tensor) -> Result<Tensor> {
        Ok(x.clone())
    }

    fn all_gather(&self, x: &Tensor, _dim: usize) -> Result<Tensor> {
        Ok(x.clone())
    }
}

/// Ranks that are threads of this process, exchanging tensors through shared slots.
/// A rank whose `ThreadComm` is dropped (its thread returned with an error, or panicked)
/// leaves the group: every collective then fails on the other ranks with which rank left,
/// instead of waiting forever for it.
#[derive(Debug)]
pub struct ThreadComm {
    rank: usize,
    size: usize,
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Debug)]
struct State {
    slots: Vec<Option<Tensor>>,
    /// Ranks arrived at the current barrier, and how many barriers have been passed.
    arrived: usize,
    passed: u64,
    /// The first rank that left the group.
    left: Option<usize>,
}

impl ThreadComm {
    /// The `size` members of one group; hand one to each rank's thread.
    pub fn group(size: usize) -> Vec<ThreadComm> {
        assert!(size > 0, "a group needs at least one rank");
        let state = State { slots: vec![None; size], arrived: 0, passed: 0, left: None };
        let shared = Arc::new(Shared { state: Mutex::new(state), changed: Condvar::new() });
        (0..size).map(|rank| ThreadComm { rank, size, shared: shared.clone() }).collect()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Wait until every rank has arrived here (with the lock held throughout `state`'s
    /// updates); an error once a rank has left.
    fn barrier<'a>(&'a self, mut state: MutexGuard<'a, State>) -> Result<MutexGuard<'a, State>> {
        let left = |state: &State| state.left.map(|rank| Error::Comm(format!("rank {rank} left the group")));
        if let Some(error) = left(&state) {
            return Err(error);
        }
        let generation = state.passed;
        state.arrived += 1;
        if state.arrived == self.size {
            state.arrived = 0;
            state.passed += 1;
            self.shared.changed.notify_all();
            return Ok(state);
        }
        while state.passed == generation {
            if let Some(error) = left(&state) {
                return Err(error);
            }
            state = self.shared.changed.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        Ok(state)
    }

    /// Publish `x`, wait for every rank's, and return them in rank order.
    fn exchange(&self, x: &Tensor) -> Result<Vec<Tensor>> {
        let mut state = self.lock();
        state.slots[self.rank] = Some(x.clone());
        let state = self.barrier(state)?;
        let all: Vec<Tensor> = state.slots.iter().flatten().cloned().collect();
        // Nobody may publish the next collective's tensor before every rank has read this one.
        drop(self.barrier(state)?);
        Ok(all)
    }
}

impl Drop for ThreadComm {
    fn drop(&mut self) {
        let mut state = self.lock();
        state.left.get_or_insert(self.rank);
        self.shared.changed.notify_all();
    }
}

impl Comm for ThreadComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn all_reduce_sum(&self, x: &Tensor) -> Result<Tensor> {
        sum_in_rank_order(self.exchange(x)?)
    }

    fn all_gather(&self, x: &Tensor, dim: usize) -> Result<Tensor> {
        Ok(Tensor::cat(&self.exchange(x)?, dim)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn thread_ranks_sum_and_a_rank_that_leaves_fails_the_others_instead_of_hanging() {
        let ranks = ThreadComm::group(3);
        let sums: Vec<Vec<f32>> = std::thread::scope(|scope| {
            let handles: Vec<_> = ranks
                .iter()
                .map(|comm| {
                    scope.spawn(move || {
                        let x = Tensor::new(&[comm.rank() as f32, 1.0], &Device::Cpu).unwrap();
                        // Several rounds: a barrier reused must not let a rank run ahead.
                        let mut sum = Vec::new();
                        for _ in 0..5 {
                            sum = comm.all_reduce_sum(&x).unwrap().to_vec1::<f32>().unwrap();
                        }
                        sum
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(sums.iter().all(|s| s == &[3.0, 3.0]), "{sums:?}");

        // Rank 2 fails before the collective (its comm dropped with its thread): the others
        // get an error naming it.
        let mut ranks = ThreadComm::group(3);
        let failing = ranks.pop().unwrap();
        let errors: Vec<String> = std::thread::scope(|scope| {
            let handles: Vec<_> = ranks
                .into_iter()
                .map(|comm| {
                    scope.spawn(move || {
                        let x = Tensor::new(&[1f32], &Device::Cpu).unwrap();
                        comm.all_reduce_sum(&x).unwrap_err().to_string()
                    })
                })
                .collect();
            std::thread::sleep(std::time::Duration::from_millis(50));
            drop(failing);
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(errors.iter().all(|e| e.contains("rank 2 left the group")), "{errors:?}");
    }

    #[test]
    fn bytes_of_any_length_gather_in_rank_order() {
        let ranks = ThreadComm::group(3);
        let gathered: Vec<Vec<Vec<u8>>> = std::thread::scope(|scope| {
            let handles: Vec<_> = ranks
                .iter()
                .map(|comm| {
                    scope.spawn(move || all_gather_bytes(comm, &vec![comm.rank() as u8 + 7; comm.rank() * 3]).unwrap())
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let expected: Vec<Vec<u8>> = vec![vec![], vec![8; 3], vec![9; 6]];
        assert!(gathered.iter().all(|g| g == &expected), "{gathered:?}");
    }
}
