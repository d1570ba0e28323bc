//! SIGINT/SIGTERM/SIGHUP delivered to the event loop with their origin, so a
//! Ctrl-C that the terminal already sent to the whole foreground group is not
//! forwarded to the target a second time.

use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::exfiltrator::WithOrigin;
use signal_hook::iterator::SignalsInfo;
use signal_hook::low_level::siginfo::Cause;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;

#[derive(Clone, Copy, Debug)]
pub struct Signal {
    pub signo: i32,
    /// Sent by the kernel on behalf of the terminal (Ctrl-C, hangup), which
    /// delivers it to the target as well.
    pub from_terminal: bool,
}

pub struct SignalSource {
    rx: mpsc::UnboundedReceiver<Signal>,
    /// Set once the recording has stopped: a signal from then on sets
    /// `again` (giving up on what is left to do, see [`Self::arm`]).
    armed: Arc<AtomicBool>,
    again: Arc<AtomicBool>,
    /// Ends the listening thread when the recording is over (the agent
    /// records window after window in one process).
    handle: signal_hook::iterator::Handle,
}

impl Drop for SignalSource {
    fn drop(&mut self) {
        self.handle.close();
    }
}

impl SignalSource {
    pub fn install() -> std::io::Result<SignalSource> {
        let mut signals = SignalsInfo::<WithOrigin>::new([SIGINT, SIGTERM, SIGHUP])?;
        let handle = signals.handle();
        let (tx, rx) = mpsc::unbounded_channel();
        let armed = Arc::new(AtomicBool::new(false));
        let again = Arc::new(AtomicBool::new(false));
        let (armed_t, again_t) = (armed.clone(), again.clone());
        std::thread::Builder::new()
            .name("gapscope-signals".into())
            .spawn(move || {
                for origin in signals.forever() {
                    if armed_t.load(Ordering::SeqCst) {
                        again_t.store(true, Ordering::SeqCst);
                    }
                    let signal = Signal {
                        signo: origin.signal,
                        from_terminal: matches!(origin.cause, Cause::Kernel),
                    };
                    if tx.send(signal).is_err() {
                        break;
                    }
                }
            })?;
        Ok(SignalSource {
            rx,
            armed,
            again,
            handle,
        })
    }

    /// From now on a signal means "stop waiting": the flag returned is set
    /// by the next one.
    pub fn arm(&self) -> Arc<AtomicBool> {
        self.armed.store(true, Ordering::SeqCst);
        self.again.clone()
    }

    pub async fn recv(&mut self) -> Option<Signal> {
        self.rx.recv().await
    }
}
