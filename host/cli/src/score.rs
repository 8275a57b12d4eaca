//! `wirl score`: score JSONL completions with a reward plugin (`wirl_app::score`).
//!
//! Input line: `{"task": {...}, "completion": "..."}`. Output line: the score and its parts,
//! or the failure, with the call's duration. Bad input lines are reported by line number and
//! field, and the other lines are still scored.

use std::io::{BufRead, BufWriter, Write};
use std::process::ExitCode;
use wirl_app::plugins::PluginOptions;
use wirl_app::score::Summary;
use wirl_sandbox::RewardPlugin;

#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    plugin: PluginOptions,
    /// JSONL input; standard input when absent.
    #[arg(long)]
    input: Option<std::path::PathBuf>,
    /// JSONL output; standard output when absent.
    #[arg(long)]
    output: Option<std::path::PathBuf>,
    /// Score each task's own reference `answer` as its completion: input lines may then be
    /// tasks alone (a dataset file). Checks a grader against its dataset.
    #[arg(long)]
    answers: bool,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if let (Some(input), Some(output)) = (&args.input, &args.output)
        && wirl_app::score::same_file(input, output)
    {
        anyhow::bail!(
            "--output {} is the --input file: writing it would empty it before it is read; choose another path",
            output.display()
        );
    }
    let (_sandbox, plugin) = args.plugin.load()?;
    let mut reward = RewardPlugin::new(plugin.clone())?;
    let input: Box<dyn BufRead> = match &args.input {
        Some(path) => Box::new(std::io::BufReader::new(
            std::fs::File::open(path).map_err(|e| anyhow::anyhow!("cannot open --input {}: {e}", path.display()))?,
        )),
        None => Box::new(std::io::stdin().lock()),
    };
    let output: Box<dyn Write> = match &args.output {
        Some(path) => Box::new(BufWriter::new(
            std::fs::File::create(path)
                .map_err(|e| anyhow::anyhow!("cannot create --output {}: {e}", path.display()))?,
        )),
        None => Box::new(BufWriter::new(std::io::stdout().lock())),
    };
    let summary = wirl_app::score::score_lines(&mut reward, input, output, args.answers, &mut |m| say!("error: {m}"))?;
    print_summary(&summary, plugin.name(), plugin.sha256());
    let unscored = summary.lines - summary.scored;
    if unscored == 0 {
        Ok(ExitCode::SUCCESS)
    } else {
        say!("{unscored} of {} lines were not scored", summary.lines);
        Ok(ExitCode::from(1))
    }
}

fn print_summary(summary: &Summary, plugin: &str, sha256: &str) {
    let failed: usize = summary.failures.values().sum();
    let mut err = std::io::stderr().lock();
    let _ = writeln!(err, "plugin      {plugin} (sha256 {})", &sha256[..12]);
    let _ = writeln!(err, "scored      {} of {} lines", summary.scored, summary.lines);
    let kinds: Vec<String> = summary.failures.iter().map(|(kind, n)| format!("{} {n}", kind.name())).collect();
    let kinds = if kinds.is_empty() { String::new() } else { format!("  ({})", kinds.join(", ")) };
    let _ = writeln!(err, "failed      {failed}{kinds}");
    let _ = writeln!(err, "bad input   {}", summary.bad_input);
    if summary.scored > 0 {
        let _ = writeln!(err, "reward      mean {:.4}", summary.reward_sum / summary.scored as f64);
        for (name, (sum, n)) in &summary.parts {
            let _ = writeln!(err, "  {name:<9} mean {:.4}", sum / *n as f64);
        }
    }
    if let (Some(p50), Some(p99)) = (summary.percentile(0.5), summary.percentile(0.99)) {
        let _ = writeln!(err, "per call    p50 {p50:?}  p99 {p99:?}");
    }
    let _ = writeln!(err, "total       {:.2?}", summary.total);
}
