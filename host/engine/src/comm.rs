//! The tensor-parallel seam: the collectives a sharded model needs, behind one trait.
//!
//! A model split over `size` ranks keeps `1/size` of each attention's heads and of each MLP's
//! intermediate width (column-parallel q/k/v, gate/up; row-parallel o, down), so every
//! block needs one all-reduce after attention and one after the MLP, and the vocabulary-split
//! output projection one all-gather. [`Solo`] is the single-rank case; [`ThreadComm`] runs
//! the ranks as threads of this process (CPU tests, and the shape NCCL fills on GPUs).

use crate::Result;
use candle_core::Tensor;
use std::sync::{Arc, Barrier, Mutex};

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
#[derive(Debug)]
pub struct ThreadComm {
    rank: usize,
    size: usize,
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    slots: Mutex<Vec<Option<Tensor>>>,
    barrier: Barrier,
}

impl ThreadComm {
    /// The `size` members of one group; hand one to each rank's thread.
    pub fn group(size: usize) -> Vec<ThreadComm> {
        assert!(size > 0, "a tensor-parallel group needs at least one rank");
        let shared = Arc::new(Shared { slots: Mutex::new(vec![None; size]), barrier: Barrier::new(size) });
        (0..size).map(|rank| ThreadComm { rank, size, shared: shared.clone() }).collect()
    }

    /// Publish `x`, wait for every rank's, and return them in rank order.
    fn exchange(&self, x: &Tensor) -> Vec<Tensor> {
        self.shared.slots.lock().unwrap_or_else(|e| e.into_inner())[self.rank] = Some(x.clone());
        self.shared.barrier.wait();
        let all: Vec<Tensor> =
            self.shared.slots.lock().unwrap_or_else(|e| e.into_inner()).iter().flatten().cloned().collect();
        // Nobody may publish the next collective's tensor before every rank has read this one.
        self.shared.barrier.wait();
        all
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
        let all = self.exchange(x);
        // Summed in rank order on every rank, so all ranks hold bit-identical results.
        let mut sum = all[0].clone();
        for part in &all[1..] {
            sum = (sum + part)?;
        }
        Ok(sum)
    }

    fn all_gather(&self, x: &Tensor, dim: usize) -> Result<Tensor> {
        Ok(Tensor::cat(&self.exchange(x), dim)?)
    }
}
