//! The live status line on stderr while recording: elapsed, events/s, drops,
//! processes tracked. Silent when disabled (not a tty, or --quiet).

use std::io::Write;
use std::time::{Duration, Instant};

pub struct StatusLine {
    enabled: bool,
    last_draw: Option<Instant>,
    last_events: u64,
    rate: f64,
}

impl StatusLine {
    pub fn new(enabled: bool) -> StatusLine {
        StatusLine {
            enabled,
            last_draw: None,
            last_events: 0,
            rate: 0.0,
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    pub fn update(&mut self, elapsed: Duration, events: u64, drops: u64, processes: usize) {
        if !self.enabled {
            return;
        }
        let now = Instant::now();
        if let Some(last) = self.last_draw {
            let dt = now.duration_since(last).as_secs_f64();
            if dt < 0.5 {
                return;
            }
            self.rate = (events - self.last_events) as f64 / dt;
        }
        self.last_draw = Some(now);
        self.last_events = events;
        let line = format!(
            "gapscope: recording {:>6.1}s · {} events/s · {} dropped · {} process{}",
            elapsed.as_secs_f64(),
            human_count(self.rate),
            drops,
            processes,
            if processes == 1 { "" } else { "es" }
        );
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K{line}");
        let _ = err.flush();
    }

    pub fn message(&mut self, text: &str) {
        if self.enabled {
            let _ = write!(std::io::stderr().lock(), "\r\x1b[2Kgapscope: {text}\n");
        }
    }

    pub fn clear(&mut self) {
        if self.enabled && self.last_draw.is_some() {
            let _ = write!(std::io::stderr().lock(), "\r\x1b[2K");
        }
    }
}

fn human_count(x: f64) -> String {
    if x >= 1e6 {
        format!("{:.1}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1}k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}
