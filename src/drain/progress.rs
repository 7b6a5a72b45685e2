//! How `drain` and `make-room` show their progress: a live table redrawn in place on a
//! terminal, one plain line per change otherwise, nothing but the final JSON document with
//! `-o json`.

use super::plan::DrainPod;
use std::io::Write;
use tokio::time::Instant;

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// A live table redrawn in place (a terminal).
    Table,
    /// One line per change (not a terminal).
    Plain,
    /// One JSON document at the end.
    Json,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum State {
    Waiting,
    Evicting,
    Blocked(String),
    Terminating,
    Gone,
    Failed(String),
}

impl State {
    pub(super) fn label(&self) -> &'static str {
        match self {
            State::Waiting => "waiting",
            State::Evicting => "evicting",
            State::Blocked(_) => "blocked",
            State::Terminating => "terminating",
            State::Gone => "gone",
            State::Failed(_) => "failed",
        }
    }
}

pub(super) struct Row {
    pub(super) pod: DrainPod,
    pub(super) state: State,
    pub(super) since: Instant,
    pub(super) gone_after: Option<f64>,
    pub(super) next_try: Instant,
}

pub(super) struct Progress<'a> {
    pub(super) out: &'a mut dyn Write,
    pub(super) output: Output,
    pub(super) start: Instant,
    drawn: usize,
}

impl<'a> Progress<'a> {
    pub(super) fn new(out: &'a mut dyn Write, output: Output) -> Self {
        Progress {
            out,
            output,
            start: Instant::now(),
            drawn: 0,
        }
    }

    pub(super) fn line(&mut self, s: &str) {
        if self.output != Output::Json {
            let _ = writeln!(self.out, "{s}");
        }
    }

    pub(super) fn change(&mut self, row: &Row) {
        if self.output != Output::Plain {
            return;
        }
        let t = self.start.elapsed().as_secs_f64();
        let detail = match &row.state {
            State::Blocked(m) | State::Failed(m) => format!(": {m}"),
            _ => String::new(),
        };
        let _ = writeln!(
            self.out,
            "[{t:6.1}s] {:<12} {}{detail}",
            row.state.label(),
            row.pod.key
        );
    }

    /// The live table (a terminal only): redrawn in place.
    pub(super) fn table(&mut self, rows: &[Row]) {
        if self.output != Output::Table {
            return;
        }
        let mut s = String::new();
        if self.drawn > 0 {
            s += &format!("\x1b[{}A", self.drawn);
        }
        let count = |l: &str| rows.iter().filter(|r| r.state.label() == l).count();
        s += &format!(
            "\x1b[2K{:6.1}s  waiting {}  evicting {}  blocked {}  terminating {}  gone {}\n",
            self.start.elapsed().as_secs_f64(),
            count("waiting"),
            count("evicting"),
            count("blocked"),
            count("terminating"),
            count("gone")
        );
        // one screen line per row, never wrapped (a wrapped line would break the redraw): cut to
        // the terminal's width (`$COLUMNS`, else 80), and at most 30 rows, unfinished first
        let width: usize = std::env::var("COLUMNS")
            .ok()
            .and_then(|c| c.parse().ok())
            .unwrap_or(80)
            .max(20);
        let mut shown: Vec<&Row> = rows.iter().filter(|r| r.state != State::Gone).collect();
        shown.extend(rows.iter().filter(|r| r.state == State::Gone));
        shown.truncate(30);
        for r in &shown {
            let detail = match &r.state {
                State::Blocked(m) | State::Failed(m) => m.as_str(),
                _ => "",
            };
            let line = format!(
                "  {:<44} {:<12} {:>6.1}s  {detail}",
                r.pod.key,
                r.state.label(),
                r.since.elapsed().as_secs_f64()
            );
            let line: String = line.chars().take(width - 1).collect();
            s += &format!("\x1b[2K{line}\n");
        }
        self.drawn = shown.len() + 1;
        let _ = self.out.write_all(s.as_bytes());
        let _ = self.out.flush();
    }
}
