//! How long each hostile answer takes to judge, natively (`cargo run --release --example
//! hostile_times --target <host>` in plugins/): the bench reports the component's own times.

fn main() {
    for (what, answer) in math_verify::hostile::hostile_answers() {
        let start = std::time::Instant::now();
        let j = math_verify::judge("9^{9^{9^{9}}} + 1", &answer, &math_verify::Settings::default());
        println!("{what:28} {:>10.3} ms  {}", start.elapsed().as_secs_f64() * 1e3, j.verdict.name());
    }
}
