//! Line charts as SVG (plotters' SVG backend: no font files or image codecs to build; viewers
//! render the text).

use std::path::Path;

use plotters::prelude::*;

/// Which part of the plane a chart shows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Axes {
    /// x from 0 (or below) to the data's end, y from 0 to a round bound above the data.
    Full,
    /// x from `from`, y between round bounds around the data there: where curves that differ by a
    /// few points are told apart (an allocation ratio between 85 and 100 %).
    ZoomFrom(f64),
}

/// Draw `curves` (name, points) into an SVG file at `path`. Curves keep their colour across
/// charts by name: `order` lists names in the order their colours are given (the paper's
/// policies); others come after, in the order drawn.
pub fn lines(
    path: &Path,
    title: &str,
    (x_label, y_label): (&str, &str),
    axes: Axes,
    order: &[&str],
    curves: &[(String, Vec<(f64, f64)>)],
) -> anyhow::Result<()> {
    let from = match axes {
        Axes::Full => f64::MIN,
        Axes::ZoomFrom(x) => x,
    };
    let points = || curves.iter().flat_map(|(_, p)| p.iter()).filter(move |p| p.0 >= from);
    let y_max = points().fold(f64::MIN, |m, &(_, y)| m.max(y));
    let y_min = points().fold(f64::MAX, |m, &(_, y)| m.min(y));
    let (y_bottom, y_top) = match axes {
        Axes::Full => (0.0, ((y_max.max(0.0) / 10.0).ceil() * 10.0).max(10.0)),
        _ if y_min > y_max => (0.0, 10.0),
        _ => ((y_min / 5.0).floor() * 5.0, ((y_max / 5.0).ceil() * 5.0).max((y_min / 5.0).floor() * 5.0 + 5.0)),
    };
    let (x_lo, x_hi) = points().fold((f64::MAX, f64::MIN), |(lo, hi), &(x, _)| (lo.min(x), hi.max(x)));
    let (x_lo, x_hi) = match axes {
        _ if x_lo >= x_hi => (0.0, 1.0),
        Axes::Full => (x_lo.min(0.0), x_hi),
        Axes::ZoomFrom(_) => (x_lo, x_hi),
    };
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(56)
        .build_cartesian_2d(x_lo..x_hi, y_bottom..y_top)?;
    chart.configure_mesh().x_desc(x_label).y_desc(y_label).draw()?;
    let mut others = order.len();
    for (name, pts) in curves {
        let index = order.iter().position(|o| o == name).unwrap_or_else(|| {
            others += 1;
            others - 1
        });
        let color = Palette99::pick(index).to_rgba();
        let shown = pts.iter().copied().filter(|p| p.0 >= from);
        chart
            .draw_series(LineSeries::new(shown, color.stroke_width(2)))?
            .label(name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// `points` of a quantity that holds its value until the next point (a utilisation after each
/// event, an empirical CDF) as the corners of a step line: joining the points straight would show
/// gradual change where there is none.
pub fn steps(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(points.len() * 2);
    for (i, &(x, y)) in points.iter().enumerate() {
        if i > 0 {
            out.push((x, points[i - 1].1));
        }
        out.push((x, y));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zoomed_chart_spans_the_data_past_its_start_and_colours_follow_names() {
        let dir = tempfile::tempdir().unwrap();
        let curve = |name: &str, lift: f64| {
            (name.to_string(), (0..=130).map(|x| (x as f64, (x as f64).min(92.0 + lift))).collect())
        };
        let curves = [curve("fgd", 3.0), curve("best-fit", 0.0)];
        let full = dir.path().join("full.svg");
        let zoom = dir.path().join("zoom.svg");
        lines(&full, "t", ("x", "y"), Axes::Full, &["best-fit", "fgd"], &curves).unwrap();
        lines(&zoom, "t", ("x", "y"), Axes::ZoomFrom(100.0), &["best-fit", "fgd"], &curves).unwrap();
        let (full, zoom) = (std::fs::read_to_string(full).unwrap(), std::fs::read_to_string(zoom).unwrap());
        // The axes' labels: from 0 in full; zoomed, y from 90 (the curves sit at 92 and 95 past
        // x = 100) and x from 100.
        let labels = |svg: &str| -> Vec<String> {
            svg.split("<text")
                .skip(1)
                .filter_map(|t| Some(t.split_once('>')?.1.split('<').next()?.trim().to_string()))
                .collect()
        };
        let (full_labels, zoom_labels) = (labels(&full), labels(&zoom));
        assert!(full_labels.iter().any(|l| l == "0.0"), "full starts at 0: {full_labels:?}");
        assert!(!zoom_labels.iter().any(|l| l == "0.0"), "zoomed does not: {zoom_labels:?}");
        assert!(zoom_labels.iter().any(|l| l == "90.0") && zoom_labels.iter().any(|l| l == "100.0"), "{zoom_labels:?}");
        // A name keeps its colour whatever order the curves come in.
        let reversed = [curves[1].clone(), curves[0].clone()];
        let again = dir.path().join("again.svg");
        lines(&again, "t", ("x", "y"), Axes::Full, &["best-fit", "fgd"], &reversed).unwrap();
        let colours = |svg: &str| -> Vec<String> {
            let mut c: Vec<String> = svg.split("stroke=\"").skip(1).map(|r| r[..7].to_string()).collect();
            c.sort();
            c.dedup();
            c
        };
        assert_eq!(colours(&full), colours(&std::fs::read_to_string(again).unwrap()));
    }

    #[test]
    fn steps_hold_each_value_until_the_next_point() {
        assert_eq!(super::steps(&[]), []);
        assert_eq!(super::steps(&[(0.0, 1.0)]), [(0.0, 1.0)]);
        assert_eq!(
            super::steps(&[(0.0, 100.0), (2.0, 50.0), (5.0, 0.0)]),
            [(0.0, 100.0), (2.0, 100.0), (2.0, 50.0), (5.0, 50.0), (5.0, 0.0)]
        );
    }
}
