//! `wirl plot RUN_DIR`: PNG line charts of a training run's `metrics.jsonl` — reward and pass
//! rate, KL, loss, completion lengths, and the time split of a step — drawn by a small
//! rasteriser here (no font or plotting stack to install), labels in an 8×8 bitmap font.

use anyhow::{Context, bail};
use font8x8::UnicodeFonts;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use wirl_trainer::metrics::{StepMetrics, read_metrics};

#[derive(clap::Args)]
pub struct Args {
    /// A run directory written by `wirl train`.
    run_dir: PathBuf,
}

/// `(label, value of a step)` of one line.
type Series = (&'static str, fn(&StepMetrics) -> f64);

/// `(file, title, lines)`: one chart each.
const CHARTS: &[(&str, &str, &[Series])] = &[
    (
        "reward.png",
        "reward",
        &[("reward mean", |m| f64::from(m.reward_mean)), ("pass rate", |m| f64::from(m.pass_rate))],
    ),
    ("kl.png", "kl to reference", &[("kl", |m| f64::from(m.kl))]),
    ("loss.png", "loss", &[("loss", |m| f64::from(m.loss))]),
    (
        "lengths.png",
        "completion tokens",
        &[("mean", |m| f64::from(m.completion_tokens_mean)), ("max", |m| m.completion_tokens_max as f64)],
    ),
    (
        "time.png",
        "seconds per step",
        &[("generate", |m| m.time_s.generate), ("score", |m| m.time_s.score), ("train", |m| m.time_s.train)],
    ),
];

const COLORS: [[u8; 3]; 4] = [[31, 119, 180], [214, 39, 40], [44, 160, 44], [148, 103, 189]];
const WIDTH: usize = 640;
const HEIGHT: usize = 360;
const LEFT: usize = 72;
const RIGHT: usize = 16;
const TOP: usize = 40;
const BOTTOM: usize = 40;

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let path = args.run_dir.join("metrics.jsonl");
    let lines = read_metrics(&path)?;
    if lines.is_empty() {
        bail!("{}: no steps yet", path.display());
    }
    for (file, title, series) in CHARTS {
        let data: Vec<(&str, Vec<(f64, f64)>)> = series
            .iter()
            .map(|(label, key)| {
                let points = lines.iter().map(|m| (m.step as f64, key(m))).filter(|(_, y)| y.is_finite()).collect();
                (*label, points)
            })
            .collect();
        let out = args.run_dir.join(file);
        write_chart(&out, title, &data)?;
        println!("{}", out.display());
    }
    // One line per task of the mixture (runs from before `[[tasks]]` have none).
    let names: std::collections::BTreeSet<&String> = lines.iter().flat_map(|m| m.tasks.keys()).collect();
    if !names.is_empty() {
        let data: Vec<(&str, Vec<(f64, f64)>)> = names
            .iter()
            .map(|name| {
                let points = lines
                    .iter()
                    .filter_map(|m| Some((m.step as f64, f64::from(m.tasks.get(*name)?.reward_mean))))
                    .filter(|(_, y)| y.is_finite())
                    .collect();
                (name.as_str(), points)
            })
            .collect();
        let out = args.run_dir.join("tasks.png");
        write_chart(&out, "reward mean per task", &data)?;
        println!("{}", out.display());
    }
    Ok(ExitCode::SUCCESS)
}

struct Canvas {
    pixels: Vec<u8>,
}

impl Canvas {
    fn set(&mut self, x: i64, y: i64, color: [u8; 3]) {
        if (0..WIDTH as i64).contains(&x) && (0..HEIGHT as i64).contains(&y) {
            let i = (y as usize * WIDTH + x as usize) * 3;
            self.pixels[i..i + 3].copy_from_slice(&color);
        }
    }

    fn line(&mut self, (x0, y0): (f64, f64), (x1, y1): (f64, f64), color: [u8; 3], thick: bool) {
        let steps = ((x1 - x0).abs().max((y1 - y0).abs()).ceil() as usize).max(1);
        for i in 0..=steps {
            let t = i as f64 / steps as f64;
            let (x, y) = ((x0 + (x1 - x0) * t).round() as i64, (y0 + (y1 - y0) * t).round() as i64);
            self.set(x, y, color);
            if thick {
                self.set(x, y + 1, color);
                self.set(x + 1, y, color);
            }
        }
    }

    fn text(&mut self, x: usize, y: usize, text: &str, color: [u8; 3]) {
        for (i, ch) in text.chars().enumerate() {
            let Some(glyph) = font8x8::BASIC_FONTS.get(ch) else { continue };
            for (row, bits) in glyph.iter().enumerate() {
                for col in 0..8 {
                    if bits & (1 << col) != 0 {
                        self.set((x + i * 8 + col) as i64, (y + row) as i64, color);
                    }
                }
            }
        }
    }
}

fn label(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 1000.0 || v.abs() < 0.01 {
        format!("{v:.1e}")
    } else {
        format!("{v:.3}").trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

fn write_chart(path: &Path, title: &str, series: &[(&str, Vec<(f64, f64)>)]) -> anyhow::Result<()> {
    let mut canvas = Canvas { pixels: vec![255; WIDTH * HEIGHT * 3] };
    let points = series.iter().flat_map(|(_, p)| p.iter());
    let (mut x_min, mut x_max, mut y_min, mut y_max) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in points {
        (x_min, x_max, y_min, y_max) = (x_min.min(x), x_max.max(x), y_min.min(y), y_max.max(y));
    }
    if x_min > x_max {
        (x_min, x_max, y_min, y_max) = (0.0, 1.0, 0.0, 1.0);
    }
    if x_max == x_min {
        x_max = x_min + 1.0;
    }
    if y_max == y_min {
        (y_min, y_max) = (y_min - 0.5, y_max + 0.5);
    }
    let (plot_w, plot_h) = ((WIDTH - LEFT - RIGHT) as f64, (HEIGHT - TOP - BOTTOM) as f64);
    let to_px = |x: f64, y: f64| {
        (
            LEFT as f64 + (x - x_min) / (x_max - x_min) * plot_w,
            TOP as f64 + (1.0 - (y - y_min) / (y_max - y_min)) * plot_h,
        )
    };
    let (grey, black) = ([200, 200, 200], [0, 0, 0]);
    for i in 0..=4 {
        let y = y_min + (y_max - y_min) * i as f64 / 4.0;
        let (_, py) = to_px(x_min, y);
        canvas.line((LEFT as f64, py), ((WIDTH - RIGHT) as f64, py), grey, false);
        let text = label(y);
        canvas.text(LEFT.saturating_sub(8 * text.len() + 4), py as usize - 4, &text, black);
    }
    let frame = [(LEFT, TOP), (WIDTH - RIGHT, TOP), (WIDTH - RIGHT, HEIGHT - BOTTOM), (LEFT, HEIGHT - BOTTOM)];
    for i in 0..4 {
        let (a, b) = (frame[i], frame[(i + 1) % 4]);
        canvas.line((a.0 as f64, a.1 as f64), (b.0 as f64, b.1 as f64), black, false);
    }
    canvas.text(LEFT, 12, title, black);
    canvas.text(LEFT, HEIGHT - BOTTOM + 8, &format!("step {}", label(x_min)), black);
    let last = label(x_max);
    canvas.text(WIDTH - RIGHT - 8 * last.len(), HEIGHT - BOTTOM + 8, &last, black);
    let mut legend_x = LEFT + 8 * title.len() + 24;
    for (i, (name, points)) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        for pair in points.windows(2) {
            canvas.line(to_px(pair[0].0, pair[0].1), to_px(pair[1].0, pair[1].1), color, true);
        }
        if points.len() == 1 {
            let (x, y) = to_px(points[0].0, points[0].1);
            canvas.line((x - 2.0, y), (x + 2.0, y), color, true);
        }
        canvas.line((legend_x as f64, 16.0), (legend_x as f64 + 16.0, 16.0), color, true);
        canvas.text(legend_x + 20, 12, name, color);
        legend_x += 20 + 8 * name.len() + 16;
    }
    let file = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut encoder = png::Encoder::new(std::io::BufWriter::new(file), WIDTH as u32, HEIGHT as u32);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    encoder.write_header()?.write_image_data(&canvas.pixels)?;
    Ok(())
}
