//! Does a device train as the CPU does? One fixed batch's loss and gradients, on the CPU's
//! fast path and on `device` through the device-generic path (candle's composed ops), the
//! whole graph and layer by layer. `wirl model check-device` prints it; `scripts/gpu-check`
//! runs it on a GPU; on the CPU it compares the two paths of one machine.

use crate::Gradients;
use crate::policy::{MemoryLimits, Policy, TokenStats};
use candle_core::{Device, Result, Tensor};
use std::collections::HashMap;
use wirl_model::Config;

/// How `device`'s loss and gradients compare with the CPU fast path's.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Agreement {
    pub loss_cpu: f32,
    pub loss_device: f32,
    /// The largest difference of one gradient's values, relative to that gradient's
    /// largest value (at least 1e-3), over every variable and both backward paths;
    /// infinite where a value is not finite.
    pub worst_relative: f32,
    pub worst_variable: String,
    /// How many variables were compared (every one with a gradient, on each path).
    pub compared: usize,
}

/// The sum of the log-probs and of the entropies, weighted: both parts of the loss reach
/// every variable.
fn loss_of(stats: &TokenStats) -> Result<(Tensor, f32)> {
    let loss = ((&stats.logp * 0.7)?.sum_all()? + (&stats.entropy * 0.1)?.sum_all()?)?;
    Ok((loss.clone(), loss.to_scalar::<f32>()?))
}

/// Compare `device` with the CPU on a fixed batch of the model `config` / `tensors` (the
/// tensors on the CPU). On the CPU itself: its composed ops against its fast ones.
pub fn compare_with_cpu(config: &Config, tensors: &HashMap<String, Tensor>, device: &Device) -> Result<Agreement> {
    let vocab = config.vocab_size.max(3) as u32;
    let token = |i: u32| 2 + (i * 7919) % (vocab - 2);
    let prompt: Vec<u32> = (0..24).map(token).collect();
    let completions: Vec<Vec<u32>> = [8u32, 5, 6]
        .iter()
        .enumerate()
        .map(|(row, &n)| (0..n).map(|i| token(100 + 31 * row as u32 + i)).collect())
        .collect();
    let cpu = Policy::new(config, tensors, &Device::Cpu)?;
    let on_device: HashMap<String, Tensor> =
        tensors.iter().map(|(name, t)| Ok((name.clone(), t.to_device(device)?))).collect::<Result<_>>()?;
    let mut other = Policy::new(config, &on_device, device)?;
    other.set_fast_paths(false);
    let layered = MemoryLimits { recompute_above: 0, keep_layers: 0, head_chunk: 1 << 20 };
    let mut agreement =
        Agreement { loss_cpu: 0.0, loss_device: 0.0, worst_relative: 0.0, worst_variable: String::new(), compared: 0 };
    for limits in [MemoryLimits::WHOLE, layered] {
        let mut want = Gradients::new();
        let mut got = Gradients::new();
        let (loss_cpu, _) = cpu.loss_and_grads(&prompt, &completions, &limits, &mut want, loss_of)?;
        let (loss_device, _) = other.loss_and_grads(&prompt, &completions, &limits, &mut got, loss_of)?;
        (agreement.loss_cpu, agreement.loss_device) = (loss_cpu, loss_device);
        for ((name, cpu_var), (_, device_var)) in cpu.vars().iter().zip(other.vars()) {
            let host = |grads: &Gradients, var| -> Result<Option<Vec<f32>>> {
                grads.tensor(var)?.map(|t| t.flatten_all()?.to_vec1::<f32>()).transpose()
            };
            let (want, got) = (host(&want, cpu_var)?, host(&got, device_var)?);
            let (Some(want), Some(got)) = (&want, &got) else {
                if want.is_some() != got.is_some() {
                    candle_core::bail!("{name} has a gradient on one device only");
                }
                continue;
            };
            let largest = want.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-3);
            let difference = want.iter().zip(got).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
            // A value that is not finite on either side is the worst there can be (a fold
            // with `max` would pass over a NaN).
            let finite = want.iter().chain(got).all(|v| v.is_finite());
            let relative = if finite { difference / largest } else { f32::INFINITY };
            agreement.compared += 1;
            if relative > agreement.worst_relative {
                agreement.worst_relative = relative;
                agreement.worst_variable = name.clone();
            }
        }
    }
    Ok(agreement)
}
