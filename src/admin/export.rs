//! The curves to take away: the picture the dashboard draws, as one SVG file, and the numbers
//! behind it as CSV. Both read the `/admin/curves` document, so `tpsgate curves` (from any
//! gateway's admin plane) and the dashboard's download buttons (`/admin/curves.svg`,
//! `/admin/curves.csv`) make the same files. Pure: a JSON document in, text out.

use std::fmt::Write as _;

use serde_json::Value;

/// One chart's size and margins, as the dashboard's.
const W: f64 = 520.0;
const H: f64 = 260.0;
const LEFT: f64 = 52.0;
const RIGHT: f64 = 14.0;
const TOP: f64 = 14.0;
const BOTTOM: f64 = 34.0;
/// A card: its title and meta lines above two charts side by side.
const CARD_HEAD: f64 = 48.0;
const CARD_GAP: f64 = 16.0;
const PAGE_PAD: f64 = 20.0;

/// The dashboard's colours.
const BG: &str = "#0f1419";
const CARD: &str = "#171d24";
const INK: &str = "#e6e9ee";
const DIM: &str = "#8a94a3";
const GRID: &str = "#263040";
const ACCENT: &str = "#4cc2ff";
const FIT: &str = "#f5b544";
const SLO: &str = "#ff6b6b";

/// A file the curves are taken away as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// The dashboard's picture.
    Svg,
    /// The numbers.
    Csv,
}

impl Format {
    /// The format an admin path asks for (`/admin/curves.svg`, `/admin/curves.csv`).
    pub(crate) fn of_path(path: &str) -> Option<Self> {
        match path {
            "/admin/curves.svg" => Some(Self::Svg),
            "/admin/curves.csv" => Some(Self::Csv),
            _ => None,
        }
    }

    /// The file, from an `/admin/curves` document.
    pub(crate) fn render(self, doc: &Value) -> String {
        match self {
            Self::Svg => svg(doc),
            Self::Csv => csv(doc),
        }
    }

    /// Its `Content-Type`.
    pub(crate) fn content_type(self) -> &'static str {
        match self {
            Self::Svg => "image/svg+xml",
            Self::Csv => "text/csv; charset=utf-8",
        }
    }

    /// Its `Content-Disposition`: a file to keep, not a page to open in place (an SVG opened
    /// in place could run script).
    pub(crate) fn disposition(self) -> &'static str {
        match self {
            Self::Svg => "attachment; filename=\"tpsgate-curves.svg\"",
            Self::Csv => "attachment; filename=\"tpsgate-curves.csv\"",
        }
    }
}

/// The CSV's columns: one row per curve point.
const CSV_HEADER: &str = "backend,model,concurrency,samples,per_user_tps_p50,per_user_tps_p10,ttft_p50_s,ttft_p90_s,fit_per_user_tps,fit_ttft_s";

/// The curves as CSV: each measured point with the fit's value at its concurrency.
pub(crate) fn csv(doc: &Value) -> String {
    let mut out = String::from(CSV_HEADER);
    out.push('\n');
    for curve in curves(doc) {
        let fit = Fit::of(curve);
        for p in points(curve) {
            let c = number(&p["concurrency"]).unwrap_or(0.0);
            let cells = [
                field(&curve["backend"]),
                field(&curve["model"]),
                cell(Some(c)),
                cell(number(&p["samples"])),
                cell(number(&p["per_user_tps_p50"])),
                cell(number(&p["per_user_tps_p10"])),
                cell(number(&p["ttft_p50_s"])),
                cell(number(&p["ttft_p90_s"])),
                cell(fit.and_then(|f| f.tps(c))),
                cell(fit.map(|f| f.ttft(c))),
            ];
            out.push_str(&cells.join(","));
            out.push('\n');
        }
    }
    out
}

/// The curves as one SVG picture: per backend and model, per-user TPS and TTFT against
/// concurrency, with the measured points and their whiskers, the fitted line and each class's
/// SLO, as the dashboard draws them.
pub(crate) fn svg(doc: &Value) -> String {
    let drawn: Vec<&Value> = curves(doc).filter(|c| points(c).next().is_some()).collect();
    let width = 2.0 * W + 3.0 * PAGE_PAD;
    let card = CARD_HEAD + H + 8.0;
    let height = 56.0 + drawn.len().max(1) as f64 * (card + CARD_GAP) + PAGE_PAD;
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" height="{height}" font-family="system-ui, sans-serif" font-size="11">"#
    );
    let _ = write!(
        s,
        r#"<rect width="{width}" height="{height}" fill="{BG}"/>"#
    );
    let _ = write!(
        s,
        r#"<text x="{PAGE_PAD}" y="32" font-size="18" fill="{INK}">tpsgate</text><text x="{}" y="32" font-size="13" fill="{DIM}">per-user tokens/s and time to first token against concurrency</text>"#,
        PAGE_PAD + 80.0
    );
    let (tps_slos, ttft_slos) = slos(doc);
    if drawn.is_empty() {
        let _ = write!(
            s,
            r#"<text x="{PAGE_PAD}" y="80" fill="{DIM}">no curves yet: they appear as soon as streams complete</text>"#
        );
    }
    for (i, curve) in drawn.iter().enumerate() {
        let y0 = 56.0 + i as f64 * (card + CARD_GAP);
        let _ = write!(
            s,
            r#"<rect x="{}" y="{y0}" width="{}" height="{card}" rx="10" fill="{CARD}" stroke="{GRID}"/>"#,
            PAGE_PAD / 2.0,
            width - PAGE_PAD
        );
        let _ = write!(
            s,
            r#"<text x="{PAGE_PAD}" y="{}" font-size="15" fill="{INK}">{} · {}</text>"#,
            y0 + 22.0,
            escape(&text(&curve["backend"])),
            escape(&text(&curve["model"]))
        );
        let _ = write!(
            s,
            r#"<text x="{PAGE_PAD}" y="{}" font-size="12" fill="{DIM}">{} observations · half-life {} s · measured p50 (whisker: p10 speed / p90 TTFT), fitted, class SLO</text>"#,
            y0 + 40.0,
            number(&curve["observations"]).unwrap_or(0.0),
            number(&curve["half_life_s"]).unwrap_or(0.0)
        );
        let fit = Fit::of(curve);
        let charts = [
            Chart {
                y: "per_user_tps_p50",
                whisker: "per_user_tps_p10",
                label: "per-user tok/s",
                x_label: "concurrency (experienced while decoding)",
                slos: &tps_slos,
                line: fit.map(|f| Box::new(move |c| f.tps(c)) as Box<dyn Fn(f64) -> Option<f64>>),
            },
            Chart {
                y: "ttft_p50_s",
                whisker: "ttft_p90_s",
                label: "TTFT (s)",
                x_label: "in flight at admission",
                slos: &ttft_slos,
                line: fit
                    .map(|f| Box::new(move |c| Some(f.ttft(c))) as Box<dyn Fn(f64) -> Option<f64>>),
            },
        ];
        for (k, chart) in charts.iter().enumerate() {
            let x0 = PAGE_PAD + k as f64 * (W + PAGE_PAD);
            let _ = write!(s, r#"<g transform="translate({x0} {})">"#, y0 + CARD_HEAD);
            chart.draw(&mut s, curve);
            s.push_str("</g>");
        }
    }
    s.push_str("</svg>\n");
    s
}

/// One chart: a y series with its whisker, the fitted line, the SLO lines.
struct Chart<'a> {
    y: &'static str,
    whisker: &'static str,
    label: &'static str,
    x_label: &'static str,
    slos: &'a [(String, f64)],
    line: Option<Box<dyn Fn(f64) -> Option<f64>>>,
}

impl Chart<'_> {
    /// Draws at the origin: x is concurrency on a log2 axis, y linear from 0 (the dashboard's
    /// `chart`).
    fn draw(&self, s: &mut String, curve: &Value) {
        let pts: Vec<(f64, f64, Option<f64>, f64)> = points(curve)
            .filter_map(|p| {
                Some((
                    number(&p["concurrency"])?,
                    number(&p[self.y])?,
                    number(&p[self.whisker]),
                    number(&p["samples"]).unwrap_or(0.0),
                ))
            })
            .collect();
        let x_max = pts.iter().map(|p| p.0).fold(2.0, f64::max) * 1.5;
        let highest = pts
            .iter()
            .map(|p| p.1)
            .chain(self.slos.iter().map(|s| s.1))
            .fold(0.0, f64::max);
        let top = nice_max(highest * 1.15);
        let x = |c: f64| LEFT + c.log2() / x_max.log2() * (W - LEFT - RIGHT);
        let y = |v: f64| H - BOTTOM - v / top * (H - TOP - BOTTOM);
        self.axes(s, x_max, top, &x, &y);
        for (name, value) in self.slos {
            let _ = write!(
                s,
                r#"<line x1="{LEFT}" x2="{}" y1="{yy:.1}" y2="{yy:.1}" stroke="{SLO}" stroke-dasharray="6 4"/><text x="{}" y="{:.1}" text-anchor="end" fill="{SLO}">{} SLO {}</text>"#,
                W - RIGHT,
                W - RIGHT - 4.0,
                y(*value) - 5.0,
                escape(name),
                tick(*value),
                yy = y(*value)
            );
        }
        if let Some(line) = &self.line {
            let mut d = String::new();
            let mut c = 1.0;
            while c <= x_max {
                if let Some(v) = line(c).filter(|v| v.is_finite() && (0.0..=top).contains(v)) {
                    let _ = write!(
                        d,
                        "{}{:.1},{:.1}",
                        if d.is_empty() { "M" } else { "L" },
                        x(c),
                        y(v)
                    );
                }
                c *= 1.1;
            }
            let _ = write!(
                s,
                r#"<path d="{d}" fill="none" stroke="{FIT}" stroke-width="2"/>"#
            );
        }
        for (c, v, whisker, samples) in pts {
            if let Some(w) = whisker {
                let _ = write!(
                    s,
                    r#"<line x1="{x:.1}" x2="{x:.1}" y1="{:.1}" y2="{:.1}" stroke="{ACCENT}" stroke-opacity=".5" stroke-width="2"/>"#,
                    y(v),
                    y(w.min(top)),
                    x = x(c)
                );
            }
            let _ = write!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="{:.1}" fill="{ACCENT}"><title>c={c}: {v:.3} ({samples} samples)</title></circle>"#,
                x(c),
                y(v),
                3.0 + ((1.0 + samples).log2() / 2.0).min(4.0)
            );
        }
    }

    /// The grid, the ticks of both axes (concurrency doubling, four steps up to `top`) and
    /// their labels; `x` and `y` place a value on the drawing.
    fn axes(
        &self,
        s: &mut String,
        x_max: f64,
        top: f64,
        x: &dyn Fn(f64) -> f64,
        y: &dyn Fn(f64) -> f64,
    ) {
        for i in 0..=4 {
            let v = top * f64::from(i) / 4.0;
            let _ = write!(
                s,
                r#"<line x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="{GRID}"/><text x="{}" y="{:.1}" text-anchor="end" fill="{DIM}">{}</text>"#,
                W - RIGHT,
                LEFT - 6.0,
                y(v) + 4.0,
                tick(v),
                y = y(v)
            );
        }
        let mut c = 1.0;
        while c <= x_max {
            let _ = write!(
                s,
                r#"<line x1="{x:.1}" x2="{x:.1}" y1="{TOP}" y2="{}" stroke="{GRID}" stroke-dasharray="2 4"/><text x="{x:.1}" y="{}" text-anchor="middle" fill="{DIM}">{c}</text>"#,
                H - BOTTOM,
                H - BOTTOM + 16.0,
                x = x(c)
            );
            c *= 2.0;
        }
        let _ = write!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle" fill="{DIM}">{}</text><text x="12" y="{mid}" text-anchor="middle" fill="{DIM}" transform="rotate(-90 12 {mid})">{}</text>"#,
            (LEFT + W - RIGHT) / 2.0,
            H - 4.0,
            self.x_label,
            self.label,
            mid = (TOP + H - BOTTOM) / 2.0
        );
    }
}

/// The fit of one curve: TPOT(c) = a + b·c, TTFT(c) = t0 + t1·(c − 1).
#[derive(Clone, Copy)]
struct Fit {
    tpot_base_s: f64,
    tpot_per_seq_s: f64,
    ttft_base_s: f64,
    ttft_per_seq_s: f64,
}

impl Fit {
    fn of(curve: &Value) -> Option<Self> {
        let f = &curve["fit"];
        Some(Self {
            tpot_base_s: number(&f["tpot_base_s"])?,
            tpot_per_seq_s: number(&f["tpot_per_seq_s"])?,
            ttft_base_s: number(&f["ttft_base_s"])?,
            ttft_per_seq_s: number(&f["ttft_per_seq_s"])?,
        })
    }

    fn tps(self, c: f64) -> Option<f64> {
        let tpot = self.tpot_base_s + self.tpot_per_seq_s * c;
        (tpot > 0.0).then(|| 1.0 / tpot)
    }

    fn ttft(self, c: f64) -> f64 {
        self.ttft_base_s + self.ttft_per_seq_s * (c - 1.0).max(0.0)
    }
}

fn curves(doc: &Value) -> impl Iterator<Item = &Value> {
    doc["curves"].as_array().into_iter().flatten()
}

fn points(curve: &Value) -> impl Iterator<Item = &Value> {
    curve["points"].as_array().into_iter().flatten()
}

/// SLO lines: a class's name and its target.
type Targets = Vec<(String, f64)>;

/// Each class's speed and TTFT targets, by name.
fn slos(doc: &Value) -> (Targets, Targets) {
    let classes = doc["classes"].as_array().into_iter().flatten();
    let pick = |key: &str| {
        classes
            .clone()
            .filter_map(|c| Some((text(&c["name"]), number(&c[key])?)))
            .collect()
    };
    (pick("min_tps"), pick("max_ttft_s"))
}

fn number(v: &Value) -> Option<f64> {
    v.as_f64().filter(|x| x.is_finite())
}

fn text(v: &Value) -> String {
    v.as_str().unwrap_or_default().to_owned()
}

/// A CSV cell for a number (empty when there is none).
fn cell(v: Option<f64>) -> String {
    v.map_or_else(String::new, |x| format!("{x}"))
}

/// A CSV cell for a string, quoted when it holds a comma, a quote or a line break.
fn field(v: &Value) -> String {
    let t = text(v);
    if t.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", t.replace('"', "\"\""))
    } else {
        t
    }
}

fn escape(t: &str) -> String {
    t.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The axis' top: 1, 2, 2.5 or 5 times a power of ten, at least `v`.
fn nice_max(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let p = 10_f64.powf(v.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|t| *t >= v)
        .unwrap_or(10.0 * p)
}

/// A tick's label: whole numbers bare, small ones with two decimals.
fn tick(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else if v < 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.1}")
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn doc() -> Value {
        json!({
            "curves": [{
                "backend": "vllm, large", "model": "m", "observations": 12, "half_life_s": 300.0,
                "points": [
                    {"concurrency": 1, "samples": 4, "per_user_tps_p50": 70.0, "per_user_tps_p10": 66.0, "ttft_p50_s": 0.05, "ttft_p90_s": 0.08},
                    {"concurrency": 8, "samples": 8, "per_user_tps_p50": 45.0, "per_user_tps_p10": null, "ttft_p50_s": 0.2, "ttft_p90_s": 0.3}
                ],
                "fit": {"tpot_base_s": 0.0135, "tpot_per_seq_s": 0.001, "ttft_base_s": 0.03, "ttft_per_seq_s": 0.02}
            }, {
                "backend": "cold", "model": "m", "observations": 0, "points": [], "fit": null
            }],
            "classes": [{"name": "interactive", "min_tps": 25.0, "max_ttft_s": 1.0}, {"name": "batch", "min_tps": null, "max_ttft_s": null}]
        })
    }

    #[test]
    fn the_csv_has_a_row_per_point_with_the_fit_beside_it() {
        let csv = csv(&doc());
        let rows: Vec<&str> = csv.lines().collect();
        assert_eq!(rows[0], CSV_HEADER);
        assert_eq!(rows.len(), 3, "{csv}");
        assert!(
            rows[1].starts_with("\"vllm, large\",m,1,4,70,66,0.05,0.08,"),
            "{csv}"
        );
        // 1 / (13.5 ms + 1 ms) at c = 1; 30 ms with none ahead.
        assert!(rows[1].ends_with(",68.96551724137932,0.03"), "{csv}");
        assert!(
            rows[2].contains(",45,,0.2,0.3,"),
            "a missing value is an empty cell: {csv}"
        );
    }

    #[test]
    fn the_svg_draws_each_observed_curve_with_its_points_fit_and_slos() {
        let svg = svg(&doc());
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("vllm, large · m"));
        assert!(
            !svg.contains("cold · m"),
            "a curve with no point is not drawn"
        );
        assert_eq!(
            svg.matches("<circle").count(),
            4,
            "two points on each chart"
        );
        assert_eq!(svg.matches(&format!("stroke=\"{FIT}\"")).count(), 2);
        assert!(svg.contains("interactive SLO 25") && svg.contains("interactive SLO 1"));
        assert!(!svg.contains("batch SLO"));
        // Well-formed enough for any XML reader: every element opened is closed.
        assert_eq!(svg.matches("<g ").count(), svg.matches("</g>").count());
    }

    #[test]
    fn an_empty_gateway_gives_a_picture_that_says_so() {
        let svg = svg(&json!({"curves": [], "classes": []}));
        assert!(svg.contains("no curves yet"));
        assert_eq!(csv(&json!({})).lines().count(), 1);
    }
}
