//! `PROGRAM COMMAND --key value ...`: the command lines of the example
//! workloads (gs-workload, gs-bench), parsed one way for both.

use std::path::PathBuf;

pub struct Args {
    pub cmd: String,
    opts: Vec<(String, String)>,
    prog: &'static str,
}

/// A usage error: one line on stderr, exit 2.
pub fn die(prog: &str, msg: &str) -> ! {
    eprintln!("{prog}: {msg}");
    std::process::exit(2);
}

impl Args {
    pub fn parse(prog: &'static str) -> Args {
        let mut it = std::env::args().skip(1);
        let cmd = it.next().unwrap_or_default();
        let rest: Vec<String> = it.collect();
        let mut opts = Vec::new();
        let mut i = 0;
        while i < rest.len() {
            let Some(key) = rest[i].strip_prefix("--") else {
                die(prog, &format!("unexpected argument {:?}", rest[i]));
            };
            let value = rest
                .get(i + 1)
                .unwrap_or_else(|| die(prog, &format!("--{key} needs a value")));
            opts.push((key.to_string(), value.clone()));
            i += 2;
        }
        Args { cmd, opts, prog }
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.opts
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn num(&self, key: &str, default: u64) -> u64 {
        match self.get(key) {
            Some(v) => v
                .parse()
                .unwrap_or_else(|_| die(self.prog, &format!("--{key}: not a number: {v}"))),
            None => default,
        }
    }

    pub fn dir(&self) -> PathBuf {
        PathBuf::from(self.get("dir").unwrap_or("."))
    }
}
