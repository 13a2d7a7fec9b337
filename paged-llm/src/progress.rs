//! Progress where a person waits (downloads, conversions, model loads, benchmarks): an
//! indicatif bar on a terminal, plain lines at every tenth of the way otherwise (a log keeps
//! them readable).

use std::io::{IsTerminal, Read};

use indicatif::{ProgressBar, ProgressStyle};

/// What a count measures, for the plain lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Bytes,
    /// Things counted one by one, named (`"tensors"`, `"requests"`).
    Items(&'static str),
}

#[derive(Debug)]
pub struct Progress {
    what: String,
    unit: Unit,
    len: u64,
    pos: u64,
    /// The tenths already printed (plain mode).
    printed_tenths: u64,
    /// The bar, on a terminal.
    bar: Option<ProgressBar>,
}

impl Progress {
    /// A bar of `len` (0: not known yet) labelled `what`.
    pub fn new(len: u64, what: &str, unit: Unit) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let counts = match unit {
                Unit::Bytes => "{bytes}/{total_bytes} {bytes_per_sec}".to_owned(),
                Unit::Items(name) => format!("{{pos}}/{{len}} {name} {{per_sec}}"),
            };
            let template = format!("{what} {{bar:40}} {counts} {{elapsed}}");
            let style =
                ProgressStyle::with_template(&template).unwrap_or_else(|_| ProgressStyle::default_bar());
            ProgressBar::new(len).with_style(style)
        });
        Self { what: what.to_owned(), unit, len, pos: 0, printed_tenths: 0, bar }
    }

    pub fn set_length(&mut self, len: u64) {
        self.len = len;
        if let Some(bar) = &self.bar {
            bar.set_length(len);
        }
    }

    pub fn set_position(&mut self, pos: u64) {
        self.pos = pos;
        match &self.bar {
            Some(bar) => bar.set_position(pos),
            None => self.print_tenths(),
        }
    }

    pub fn inc(&mut self, by: u64) {
        self.set_position(self.pos.saturating_add(by));
    }

    /// Clears the bar (a terminal) or prints the last line if it was not printed (plain).
    pub fn finish(mut self) {
        match self.bar.take() {
            Some(bar) => bar.finish_and_clear(),
            None if self.printed_tenths < 10 => {
                self.printed_tenths = 9;
                self.pos = self.pos.max(self.len);
                self.print_tenths();
            }
            None => {}
        }
    }

    /// A reader that advances this bar by what it reads.
    pub fn wrap_read<R: Read>(&mut self, inner: R) -> ProgressRead<'_, R> {
        ProgressRead { inner, progress: self }
    }

    fn print_tenths(&mut self) {
        if self.len == 0 {
            return;
        }
        let tenths = (self.pos.min(self.len) * 10 / self.len).min(10);
        if tenths > self.printed_tenths {
            self.printed_tenths = tenths;
            let counts = match self.unit {
                Unit::Bytes => format!("{:.1} of {:.1} MiB", mib(self.pos), mib(self.len)),
                Unit::Items(name) => format!("{} of {} {name}", self.pos, self.len),
            };
            eprintln!("{}: {}% ({counts})", self.what, tenths * 10);
        }
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

/// [`Progress::wrap_read`]'s reader.
#[derive(Debug)]
pub struct ProgressRead<'a, R> {
    inner: R,
    progress: &'a mut Progress,
}

impl<R: Read> Read for ProgressRead<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.progress.inc(n as u64);
        Ok(n)
    }
}
