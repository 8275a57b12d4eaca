//! PNG line charts of a training run's `metrics.jsonl` — reward and pass
//! rate, KL, loss, completion lengths, the time split of a step, and the reward of each task
//! of a mixture — drawn with plotters (axes, ticks, legends) and DejaVu Sans, which the
//! binary carries (assets/, with its licence), so that no font needs installing.

use anyhow::{Context, bail};
use plotters::prelude::*;
use std::path::{Path, PathBuf};
use wirl_trainer::metrics::{StepMetrics, read_metrics};

/// `(label, value of a step)` of one line.
type Series = (&'static str, fn(&StepMetrics) -> f64);

/// `(file, title, lines)`: one chart each.
const CHARTS: &[(&str, &str, &[Series])] = &[
    (
        "reward.png",
        "reward",
        &[("reward mean", |m| f64::from(m.reward_mean)), ("pass rate", |m| f64::from(m.pass_rate))],
    ),
    (
        "kl.png",
        "kl to reference",
        // Under `grpo.kl_in_reward` the loss has no KL term: the rewards' KL is the one to see
        // (no points, and no legend entry, in other runs).
        &[("kl", |m| f64::from(m.kl)), ("kl in reward", |m| m.reward_kl.unwrap_or(f64::NAN))],
    ),
    ("loss.png", "loss", &[("loss", |m| f64::from(m.loss))]),
    (
        "lengths.png",
        "completion tokens",
        &[("mean", |m| f64::from(m.completion_tokens_mean)), ("max", |m| m.completion_tokens_max as f64)],
    ),
    (
        "time.png",
        "seconds per step",
        &[
            ("generate", |m| m.time_s.generate),
            ("episodes", |m| m.time_s.episodes),
            ("agents", |m| m.time_s.agents),
            ("score", |m| m.time_s.score),
            ("train", |m| m.time_s.train),
        ],
    ),
];

const FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");
const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(23, 190, 207),
];
const WIDTH: u32 = 800;
const HEIGHT: u32 = 450;

/// `wirl plot RUN_DIR`: every chart of the run in `run_dir` written beside its metrics; the
/// files written, in order.
pub fn draw(run_dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let path = run_dir.join("metrics.jsonl");
    let lines = read_metrics(&path)?;
    if lines.is_empty() {
        bail!("{}: no steps yet", path.display());
    }
    plotters::style::register_font("sans-serif", FontStyle::Normal, FONT)
        .map_err(|_| anyhow::anyhow!("the embedded font cannot be read"))?;
    let points = |value: &dyn Fn(&StepMetrics) -> Option<f64>| -> Vec<(f64, f64)> {
        lines.iter().filter_map(|m| Some((m.step as f64, value(m)?))).filter(|(_, y)| y.is_finite()).collect()
    };
    // Task set changes (hot swap): a vertical line between the steps they came between.
    let marks: Vec<(f64, bool)> = wirl_trainer::swap::read_events(run_dir)?
        .iter()
        .filter(|e| e.kind == "applied" || e.kind == "rolled-back")
        .map(|e| (e.step as f64 + 0.5, e.kind == "rolled-back"))
        .collect();
    for (file, title, series) in CHARTS {
        let data: Vec<(String, Vec<(f64, f64)>)> =
            series.iter().map(|(label, key)| (label.to_string(), points(&|m| Some(key(m))))).collect();
        // A time split with nothing in a phase (no episodes, no agents) leaves the phase out,
        // as does any chart a line without points.
        let data: Vec<_> = data
            .into_iter()
            .filter(|(_, p)| !p.is_empty() && (p.iter().any(|(_, y)| *y != 0.0) || series.len() < 5))
            .collect();
        let out = run_dir.join(file);
        write_chart(&out, title, &data, &marks)?;
        written.push(out);
    }
    // One line per task of the mixture (runs from before `[[tasks]]` have none).
    let names: std::collections::BTreeSet<&String> = lines.iter().flat_map(|m| m.tasks.keys()).collect();
    if !names.is_empty() {
        let data: Vec<(String, Vec<(f64, f64)>)> = names
            .iter()
            .map(|name| ((*name).clone(), points(&|m| Some(f64::from(m.tasks.get(*name)?.reward_mean)))))
            .collect();
        let out = run_dir.join("tasks.png");
        write_chart(&out, "reward mean per task", &data, &marks)?;
        written.push(out);
    }
    Ok(written)
}

/// A line chart of `series` against the step, with a legend; `marks` are task set changes
/// (x, whether a rollback), drawn as vertical lines. Over ~80 lines on purpose: plotters'
/// builder calls for one chart (axes, series, marks, legend), in the order they draw.
fn write_chart(
    path: &Path,
    title: &str,
    series: &[(String, Vec<(f64, f64)>)],
    marks: &[(f64, bool)],
) -> anyhow::Result<()> {
    let all = series.iter().flat_map(|(_, p)| p.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in all {
        (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    // A change after the last recorded step still shows.
    for &(x, _) in marks {
        x1 = x1.max(x);
    }
    if x1 - x0 < 1.0 {
        x1 = x0 + 1.0;
    }
    let pad = ((y1 - y0) * 0.05).max(1e-6);
    let (y0, y1) = (y0 - pad, y1 + pad);
    let mut pixels = vec![0u8; (WIDTH * HEIGHT * 3) as usize];
    {
        let draw = |e: &dyn std::fmt::Display| anyhow::anyhow!("drawing {}: {e}", path.display());
        let root = BitMapBackend::with_buffer(&mut pixels, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| draw(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 22))
            .margin(14)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(|e| draw(&e))?;
        chart
            .configure_mesh()
            .x_desc("step")
            .label_style(("sans-serif", 13))
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(|e| draw(&e))?;
        for (i, (label, points)) in series.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            chart
                .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)))
                .map_err(|e| draw(&e))?
                .label(label.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
            chart.draw_series(points.iter().map(|&p| Circle::new(p, 2, color.filled()))).map_err(|e| draw(&e))?;
        }
        for (kind, rollback, color) in
            [("task set applied", false, RGBColor(44, 160, 44)), ("rolled back", true, RGBColor(214, 39, 40))]
        {
            let xs: Vec<f64> = marks.iter().filter(|(_, r)| *r == rollback).map(|(x, _)| *x).collect();
            if xs.is_empty() {
                continue;
            }
            for (i, x) in xs.iter().enumerate() {
                let drawn = chart
                    .draw_series(LineSeries::new([(*x, y0), (*x, y1)], color.stroke_width(2)))
                    .map_err(|e| draw(&e))?;
                if i == 0 {
                    drawn
                        .label(kind)
                        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(1)));
                }
            }
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .label_font(("sans-serif", 13))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| draw(&e))?;
        root.present().map_err(|e| draw(&e))?;
    }
    let file = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut encoder = png::Encoder::new(std::io::BufWriter::new(file), WIDTH, HEIGHT);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    encoder.write_header()?.write_image_data(&pixels)?;
    Ok(())
}
