//! Read a JSONL event file into a ledger N times and print the events per second (what
//! `wasmsched usage --file` spends its time on), e.g. under `perf stat`:
//! `cargo run --release -p wasmsched-usage --example read -- events.jsonl 5`.

use std::time::Instant;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let path = args.next().ok_or("usage: read FILE [TIMES]")?;
    let times: u32 = args.next().map_or(Ok(3), |n| n.parse())?;
    for _ in 0..times {
        let t = Instant::now();
        let mut ledger = wasmsched_usage::Ledger::new();
        wasmsched_usage::journal::read_file(std::path::Path::new(&path), &mut ledger)?;
        let events = ledger.intake().events;
        let s = t.elapsed().as_secs_f64();
        eprintln!("{events} events in {:.0} ms: {:.0} events/s", s * 1e3, events as f64 / s);
    }
    Ok(())
}
