//! A timeline as a self-contained SVG Gantt chart (`reaplet pods --timeline … --svg FILE`):
//! one row for the pod's own stages and one per container, the SIGKILL deadline as a red
//! vertical line, SIGKILLs marked. No script, no external font or style: it opens in any
//! browser.
//!
//! Invariants: pure; [`layout`] is the one place that maps milliseconds to x, so a test can
//! find the deadline where the data puts it; the deadline line sits on a whole pixel in pure
//! red, a colour nothing else in the chart uses.

use super::{Step, Timeline};
use std::fmt::Write as _;

/// The chart's geometry.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Layout {
    pub width: f64,
    pub height: f64,
    /// The plot area's left edge and width (x of 0 ms, and how far the scale reaches).
    pub left: f64,
    pub plot_width: f64,
    /// The milliseconds the plot width stands for.
    pub total_ms: f64,
    pub top: f64,
    pub row_height: f64,
    pub rows: usize,
}

impl Layout {
    /// x of `ms` (a whole pixel).
    pub fn x(&self, ms: f64) -> f64 {
        (self.left + ms.clamp(0.0, self.total_ms) / self.total_ms * self.plot_width).round()
    }

    /// y of the top of row `i`.
    pub fn row_y(&self, i: usize) -> f64 {
        self.top + i as f64 * self.row_height
    }

    fn bottom(&self) -> f64 {
        self.row_y(self.rows)
    }
}

/// The pure red of the deadline line.
pub const DEADLINE_RGB: (u8, u8, u8) = (255, 0, 0);
const SIGKILL_COLOUR: &str = "#7a0000";
const PRESTOP_COLOUR: &str = "#e8a317";
const TERM_COLOUR: &str = "#2b7bb9";
const STAGE_COLOURS: [(&str, &str); 4] = [
    ("stopping", "#5a6f8c"),
    ("volumes", "#4f9a4f"),
    ("cgroup", "#8a5fb0"),
    ("API", "#c77700"),
];

/// The containers in the order they first appear.
fn containers(t: &Timeline) -> Vec<&str> {
    let mut out: Vec<&str> = Vec::new();
    for e in &t.entries {
        if let Some(c) = e.container.as_deref()
            && !out.contains(&c)
        {
            out.push(c);
        }
    }
    out
}

/// Where everything goes for `t`.
pub fn layout(t: &Timeline) -> Layout {
    let rows = 1 + containers(t).len();
    let total_ms = (t.span_ms() * 1.08).max(1000.0);
    Layout {
        width: 1000.0,
        height: 70.0 + rows as f64 * 40.0 + 80.0,
        left: 150.0,
        plot_width: 820.0,
        total_ms,
        top: 60.0,
        row_height: 40.0,
        rows,
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A tick step of 1, 2 or 5 × 10^k ms giving at most ~10 ticks.
fn tick_ms(total: f64) -> f64 {
    let raw = total / 10.0;
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag)
}

fn bar(out: &mut String, l: &Layout, row: usize, from: f64, to: f64, colour: &str, title: &str) {
    let (x0, x1) = (l.x(from), l.x(to));
    let y = l.row_y(row) + 10.0;
    let _ = writeln!(
        out,
        r#"<rect x="{x0}" y="{y}" width="{}" height="20" fill="{colour}" rx="2"><title>{}</title></rect>"#,
        (x1 - x0).max(2.0),
        esc(title)
    );
}

/// The whole chart.
pub fn render(t: &Timeline) -> String {
    let l = layout(t);
    let names = containers(t);
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#,
        w = l.width,
        h = l.height
    );
    let _ = writeln!(
        out,
        r##"<rect x="0" y="0" width="{}" height="{}" fill="#ffffff"/>"##,
        l.width, l.height
    );
    let reason = t.entries.iter().find_map(|e| match &e.step {
        Step::Reason {
            reason,
            grace,
            grace_from,
            ..
        } => Some(format!(
            "{reason}, grace {grace}s from {}",
            grace_from.as_str()
        )),
        _ => None,
    });
    let _ = writeln!(
        out,
        r#"<text x="10" y="22" font-size="15" font-weight="bold">{}</text>"#,
        esc(&format!(
            "{}: {}",
            t.key(),
            reason.unwrap_or_else(|| "terminating".into())
        ))
    );
    let _ = writeln!(
        out,
        r##"<text x="10" y="40" fill="#555555">{}</text>"##,
        esc(&format!("started {}  (uid {})", t.started_at, t.uid))
    );

    // rows and their labels
    for r in 0..l.rows {
        let y = l.row_y(r);
        let fill = if r % 2 == 0 { "#f4f6f8" } else { "#ffffff" };
        let _ = writeln!(
            out,
            r#"<rect x="0" y="{y}" width="{}" height="{}" fill="{fill}"/>"#,
            l.width, l.row_height
        );
        let label = if r == 0 { "pod" } else { names[r - 1] };
        let _ = writeln!(
            out,
            r#"<text x="10" y="{}">{}</text>"#,
            y + 25.0,
            esc(label)
        );
    }

    // axis
    let step = tick_ms(l.total_ms);
    let mut ms = 0.0;
    while ms <= l.total_ms {
        let x = l.x(ms);
        let _ = writeln!(
            out,
            r##"<line x1="{x}" y1="{}" x2="{x}" y2="{}" stroke="#dddddd" shape-rendering="crispEdges"/>"##,
            l.top,
            l.bottom()
        );
        let _ = writeln!(
            out,
            r##"<text x="{x}" y="{}" text-anchor="middle" fill="#555555">{}s</text>"##,
            l.bottom() + 16.0,
            trim(ms / 1e3)
        );
        ms += step;
    }

    // the pod's own stages
    let at = |f: &dyn Fn(&Step) -> bool| t.entries.iter().find(|e| f(&e.step)).map(|e| e.at_ms);
    let last =
        |f: &dyn Fn(&Step) -> bool| t.entries.iter().rev().find(|e| f(&e.step)).map(|e| e.at_ms);
    let kill_start = at(&|s| matches!(s, Step::KillStarted { .. })).unwrap_or(0.0);
    let stopped = at(&|s| matches!(s, Step::ContainersStopped));
    let vol_start = at(&|s| matches!(s, Step::VolumesStarted));
    let vol_done = last(&|s| matches!(s, Step::VolumesDone { .. }));
    let cgroup = at(&|s| matches!(s, Step::CgroupRemoved { .. }));
    let status = at(&|s| matches!(s, Step::StatusWritten { .. }));
    let deleted = at(&|s| matches!(s, Step::ObjectDeleted { .. }));
    let now = t.span_ms();
    bar(
        &mut out,
        &l,
        0,
        kill_start,
        stopped.unwrap_or(now),
        STAGE_COLOURS[0].1,
        "stopping containers and sandboxes",
    );
    if let Some(v) = vol_start {
        bar(
            &mut out,
            &l,
            0,
            v,
            vol_done.unwrap_or(now),
            STAGE_COLOURS[1].1,
            "volumes",
        );
    }
    if let (Some(v), Some(c)) = (vol_done, cgroup) {
        bar(&mut out, &l, 0, v, c, STAGE_COLOURS[2].1, "pod cgroup");
    }
    if let Some(s) = status.or(deleted) {
        bar(
            &mut out,
            &l,
            0,
            s,
            deleted.unwrap_or(s),
            STAGE_COLOURS[3].1,
            "terminal status and delete",
        );
    }

    // containers: preStop, SIGTERM to exit, SIGKILLs
    for (i, name) in names.iter().enumerate() {
        let row = i + 1;
        let mine: Vec<&super::Entry> = t
            .entries
            .iter()
            .filter(|e| e.container.as_deref() == Some(*name))
            .collect();
        let find = |f: &dyn Fn(&Step) -> bool| mine.iter().find(|e| f(&e.step)).map(|e| e.at_ms);
        let exited = find(&|s| matches!(s, Step::Exited { .. }));
        if let Some(p) = find(&|s| matches!(s, Step::PreStopStarted)) {
            let end = find(&|s| matches!(s, Step::PreStopEnded { .. }))
                .or(exited)
                .unwrap_or(now);
            bar(&mut out, &l, row, p, end, PRESTOP_COLOUR, "preStop hook");
        }
        if let Some(s) = find(&|s| matches!(s, Step::StopSent { .. })) {
            bar(
                &mut out,
                &l,
                row,
                s,
                exited.unwrap_or(now),
                TERM_COLOUR,
                "stop sent until the exit",
            );
        }
        for e in &mine {
            match &e.step {
                Step::Sigkill | Step::StopSent { timeout: 0, .. } => {
                    let x = l.x(e.at_ms);
                    let y = l.row_y(row) + 20.0;
                    let _ = writeln!(
                        out,
                        r#"<path d="M{} {} L{} {} M{} {} L{} {}" stroke="{SIGKILL_COLOUR}" stroke-width="3"><title>SIGKILL at {}</title></path>"#,
                        x - 7.0,
                        y - 7.0,
                        x + 7.0,
                        y + 7.0,
                        x - 7.0,
                        y + 7.0,
                        x + 7.0,
                        y - 7.0,
                        super::text::describe(&e.step).replace('"', "")
                    );
                    let _ = writeln!(
                        out,
                        r#"<text x="{}" y="{}" fill="{SIGKILL_COLOUR}" font-weight="bold">SIGKILL</text>"#,
                        x + 10.0,
                        y - 8.0
                    );
                }
                Step::Exited { code, .. } => {
                    let x = l.x(e.at_ms);
                    let _ = writeln!(
                        out,
                        r#"<text x="{}" y="{}">exit {code}</text>"#,
                        x + 4.0,
                        l.row_y(row) + 25.0
                    );
                }
                _ => {}
            }
        }
    }

    // the grace deadline
    if let Some(d) = t.deadline_ms {
        let x = l.x(d);
        let (r, g, b) = DEADLINE_RGB;
        let _ = writeln!(
            out,
            r#"<line id="deadline" data-ms="{d:.0}" x1="{x}" y1="{}" x2="{x}" y2="{}" stroke="rgb({r},{g},{b})" stroke-width="2" stroke-dasharray="8 4" shape-rendering="crispEdges"/>"#,
            l.top - 8.0,
            l.bottom()
        );
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" fill="rgb({r},{g},{b})" text-anchor="end">grace deadline {}s</text>"#,
            x - 4.0,
            l.top - 10.0,
            trim(d / 1e3)
        );
    }

    // legend
    let y = l.bottom() + 44.0;
    let mut x = 10.0;
    let legend = [
        ("preStop hook", PRESTOP_COLOUR),
        ("SIGTERM to exit", TERM_COLOUR),
        ("stopping (pod)", STAGE_COLOURS[0].1),
        ("volumes", STAGE_COLOURS[1].1),
        ("cgroup", STAGE_COLOURS[2].1),
        ("status + delete", STAGE_COLOURS[3].1),
    ];
    for (label, colour) in legend {
        let _ = writeln!(
            out,
            r#"<rect x="{x}" y="{}" width="14" height="14" fill="{colour}"/><text x="{}" y="{}">{label}</text>"#,
            y - 11.0,
            x + 18.0,
            y
        );
        x += 30.0 + label.len() as f64 * 7.0;
    }
    let _ = writeln!(
        out,
        r#"<text x="{x}" y="{y}" fill="{SIGKILL_COLOUR}" font-weight="bold">✕ SIGKILL</text>"#
    );
    out.push_str("</svg>\n");
    out
}

/// `1.5` → "1.5", `2.0` → "2".
fn trim(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    s.to_string()
}
