//! One rank of a data-parallel job on a SIMULATED GPU: each step computes,
//! then all-reduces with the other ranks (an NCCL-named kernel that ends
//! when the last rank has reached it), then synchronizes. The ranks are
//! separate processes — one `gapscope run` each, as on separate nodes —
//! and meet through datagram sockets in a directory they share. `--late-ms` makes this rank's host
//! slower each step, so the others wait for it at every all-reduce.
//!
//! Ground truth, written as JSON to --truth: for every rank, how long the
//! others waited for it at all-reduces (the last rank's start less each
//! other rank's, summed over the steps it came last), how often it came
//! last, and how long its own all-reduces waited for the last rank's start
//! (`waited_ns`). Every rank knows every rank's start, so each writes the
//! whole.

use std::collections::HashMap;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::time::Duration;

use gapscope_wire::clock::monotonic_ns as now;
use gs_simgpu::{spin_wall, SimDevice};

const USAGE: &str = "\
simranks: one rank of a data-parallel job on a SIMULATED GPU

usage: simranks --rank R --world W --dir DIR [--steps N] [--compute-ms C]
                [--late-ms L] [--truth FILE] [--fix sync]

  Rank R listens on DIR/rank-R.sock and meets the others there.
  --fix sync: no synchronize after each all-reduce (one at the end).";

const HELLO: u64 = u64::MAX;

fn die(msg: &str) -> ! {
    eprintln!("simranks: {msg}");
    std::process::exit(2)
}

struct Peers {
    sock: UnixDatagram,
    rank: u64,
    world: u64,
    dir: PathBuf,
    /// Starts heard, by step: (rank, start).
    heard: HashMap<u64, Vec<(u64, u64)>>,
}

impl Peers {
    fn send(&self, to: u64, step: u64, value: u64) {
        let mut m = [0u8; 24];
        m[..8].copy_from_slice(&step.to_le_bytes());
        m[8..16].copy_from_slice(&self.rank.to_le_bytes());
        m[16..].copy_from_slice(&value.to_le_bytes());
        // A peer not listening yet: the hello is sent again.
        let _ = self
            .sock
            .send_to(&m, self.dir.join(format!("rank-{to}.sock")));
    }

    /// One message; hellos are answered (a peer still starting up keeps
    /// asking until it hears from us).
    fn recv(&mut self) -> Option<(u64, u64, u64)> {
        let mut m = [0u8; 24];
        let n = match self.sock.recv(&mut m) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return None,
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return None,
            Err(_) => return None,
        };
        if n != 24 {
            return None;
        }
        let at = |i: usize| u64::from_le_bytes(m[i * 8..i * 8 + 8].try_into().unwrap());
        let (step, from, value) = (at(0), at(1), at(2));
        if step == HELLO && value == 0 {
            self.send(from, HELLO, 1);
        }
        Some((step, from, value))
    }

    /// Until every peer has been heard from.
    fn barrier(&mut self) {
        let mut seen = vec![false; self.world as usize];
        seen[self.rank as usize] = true;
        let deadline = now() + 60_000_000_000;
        while seen.iter().any(|s| !s) {
            if now() > deadline {
                die("the other ranks never answered");
            }
            for j in 0..self.world {
                if !seen[j as usize] {
                    self.send(j, HELLO, 0);
                }
            }
            while let Some((step, from, value)) = self.recv() {
                if step == HELLO {
                    seen[from as usize] = true;
                } else {
                    self.heard.entry(step).or_default().push((from, value));
                }
            }
        }
    }

    /// Tells every peer this rank's start of `step`'s all-reduce; returns
    /// every rank's, once all are in.
    fn meet(&mut self, step: u64, start: u64) -> Vec<(u64, u64)> {
        for j in 0..self.world {
            if j != self.rank {
                self.send(j, step, start);
            }
        }
        let deadline = now() + 60_000_000_000;
        loop {
            let got = self.heard.get(&step).map_or(0, Vec::len);
            if got as u64 + 1 >= self.world {
                break;
            }
            if now() > deadline {
                die(&format!("step {step}: the other ranks never came"));
            }
            if let Some((s, from, value)) = self.recv() {
                if s != HELLO {
                    self.heard.entry(s).or_default().push((from, value));
                }
            }
        }
        let mut all = self.heard.remove(&step).unwrap_or_default();
        all.push((self.rank, start));
        all.sort_unstable();
        all
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return;
    }
    let get = |k: &str| {
        args.iter()
            .position(|a| a == k)
            .and_then(|i| args.get(i + 1))
            .map(String::as_str)
    };
    let num = |k: &str, default: Option<u64>| -> u64 {
        match get(k) {
            Some(v) => v
                .parse()
                .unwrap_or_else(|_| die(&format!("{k}: not a number: {v}\n\n{USAGE}"))),
            None => default.unwrap_or_else(|| die(&format!("{k} is required\n\n{USAGE}"))),
        }
    };
    let (rank, world) = (num("--rank", None), num("--world", None));
    let dir = PathBuf::from(
        get("--dir").unwrap_or_else(|| die(&format!("--dir is required\n\n{USAGE}"))),
    );
    let steps = num("--steps", Some(40));
    let compute = num("--compute-ms", Some(4)) * 1_000_000;
    let late = num("--late-ms", Some(0)) * 1_000_000;
    let no_sync = match get("--fix") {
        None => false,
        Some("sync") => true,
        Some(other) => die(&format!(
            "--fix: only sync can be fixed, not {other}\n\n{USAGE}"
        )),
    };
    if world < 2 || rank >= world {
        die(&format!(
            "--rank must be below --world, which must be 2 or more\n\n{USAGE}"
        ));
    }
    let path = dir.join(format!("rank-{rank}.sock"));
    let _ = std::fs::remove_file(&path);
    let sock =
        UnixDatagram::bind(&path).unwrap_or_else(|e| die(&format!("{}: {e}", path.display())));
    sock.set_read_timeout(Some(Duration::from_millis(10)))
        .unwrap_or_else(|e| die(&e.to_string()));
    let mut peers = Peers {
        sock,
        rank,
        world,
        dir,
        heard: HashMap::new(),
    };
    let mut dev = SimDevice::connect(&format!("simranks rank {rank} of {world}"));
    peers.barrier();
    let mut waited_for = vec![0u64; world as usize];
    let mut last_at = vec![0u64; world as usize];
    let mut waited = vec![0u64; world as usize];
    for step in 0..steps {
        // This rank's host work before it can launch (what makes a rank
        // late: its input, its CPU), then forward and backward.
        spin_wall(late);
        dev.launch(compute / 2, 20_000);
        dev.launch(compute / 2, 20_000);
        let mut all = Vec::new();
        dev.all_reduce(300_000, !no_sync, |start| {
            all = peers.meet(step, start);
            all.iter().map(|x| x.1).max().unwrap_or(start)
        });
        dev.flush();
        let (last_rank, last) = all.iter().copied().max_by_key(|x| x.1).unwrap();
        waited_for[last_rank as usize] += all.iter().map(|x| last - x.1).sum::<u64>();
        last_at[last_rank as usize] += 1;
        for &(r, start) in &all {
            waited[r as usize] += last - start;
        }
    }
    if no_sync {
        dev.synchronize();
    }
    dev.goodbye();
    if let Some(path) = get("--truth") {
        let ranks: Vec<String> = (0..world as usize)
            .map(|r| {
                format!(
                    "{{\"rank\": {r}, \"waited_for_ns\": {}, \"last_at\": {}, \"waited_ns\": {}}}",
                    waited_for[r], last_at[r], waited[r]
                )
            })
            .collect();
        let json = format!(
            "{{\"simulated\": true, \"steps\": {steps}, \"ranks\": [{}]}}\n",
            ranks.join(", ")
        );
        std::fs::write(path, json).unwrap_or_else(|e| die(&format!("{path}: {e}")));
    }
    eprintln!(
        "simranks rank {rank} of {world}: SIMULATED GPU, {steps} steps; the others waited {:.1} ms for this rank",
        waited_for[rank as usize] as f64 / 1e6
    );
}
