//! Line charts, each written twice: SVG (text left to the viewer) and PNG at twice the size (for
//! slides and papers). PNG text is drawn with a subset of DejaVu Sans embedded in the binary (35 KB,
//! licence in `assets/`): a chart must look the same on a machine without fonts.

use std::path::Path;
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;

/// The embedded font, registered as plotters' "sans-serif" before the first chart.
const FONT: &[u8] = include_bytes!("../assets/DejaVuSans-subset.ttf");

/// Which part of the plane a chart shows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Axes {
    /// x from 0 (or below) to the data's end, y from 0 to a round bound above the data.
    Full,
    /// x from `from`, y between round bounds around the data there: where curves that differ by a
    /// few points are told apart (an allocation ratio between 85 and 100 %).
    ZoomFrom(f64),
}

/// One chart's content, drawn the same into each format.
struct Chart<'a> {
    title: &'a str,
    labels: (&'a str, &'a str),
    order: &'a [&'a str],
    curves: &'a [(String, Vec<(f64, f64)>)],
    from: f64,
    x: (f64, f64),
    y: (f64, f64),
}

/// SVG size in pixels; the PNG is drawn at twice it.
const SIZE: (u32, u32) = (900, 560);

/// Draw `curves` (name, points) into an SVG file at `path` and a PNG beside it (the same name with
/// `.png`). Curves keep their colour across charts by name: `order` lists names in the order their
/// colours are given (the paper's policies); others come after, in the order drawn.
pub fn lines(
    path: &Path,
    title: &str,
    labels: (&str, &str),
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
    let y = match axes {
        Axes::Full => (0.0, ((y_max.max(0.0) / 10.0).ceil() * 10.0).max(10.0)),
        _ if y_min > y_max => (0.0, 10.0),
        _ => ((y_min / 5.0).floor() * 5.0, ((y_max / 5.0).ceil() * 5.0).max((y_min / 5.0).floor() * 5.0 + 5.0)),
    };
    let (x_lo, x_hi) = points().fold((f64::MAX, f64::MIN), |(lo, hi), &(x, _)| (lo.min(x), hi.max(x)));
    let x = match axes {
        _ if x_lo >= x_hi => (0.0, 1.0),
        Axes::Full => (x_lo.min(0.0), x_hi),
        Axes::ZoomFrom(_) => (x_lo, x_hi),
    };
    let chart = Chart { title, labels, order, curves, from, x, y };
    static REGISTER: Once = Once::new();
    REGISTER.call_once(|| {
        // The bytes are a valid font (a test draws with them), so this cannot fail at run time.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    });

    chart.draw(SVGBackend::new(path, SIZE).into_drawing_area(), 1)?;
    let (w, h) = (SIZE.0 * 2, SIZE.1 * 2);
    let mut rgb = vec![0u8; (w * h * 3) as usize];
    chart.draw(BitMapBackend::with_buffer(&mut rgb, (w, h)).into_drawing_area(), 2)?;
    write_png(&path.with_extension("png"), (w, h), &rgb)
}

impl Chart<'_> {
    /// Draw into `root`, every size multiplied by `scale`.
    fn draw<DB: DrawingBackend>(&self, root: DrawingArea<DB, Shift>, scale: u32) -> anyhow::Result<()>
    where
        DB::ErrorType: 'static,
    {
        let px = |n: u32| n * scale;
        let font = |n: u32| ("sans-serif", f64::from(n * scale));
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(self.title, font(20))
            .margin(px(16))
            .x_label_area_size(px(44))
            .y_label_area_size(px(56))
            .build_cartesian_2d(self.x.0..self.x.1, self.y.0..self.y.1)?;
        chart
            .configure_mesh()
            .x_desc(self.labels.0)
            .y_desc(self.labels.1)
            .label_style(font(12))
            .axis_desc_style(font(14))
            .draw()?;
        let mut others = self.order.len();
        for (name, pts) in self.curves {
            let index = self.order.iter().position(|o| o == name).unwrap_or_else(|| {
                others += 1;
                others - 1
            });
            let color = Palette99::pick(index).to_rgba();
            let stroke = color.stroke_width(px(2));
            let shown = pts.iter().copied().filter(|p| p.0 >= self.from);
            chart
                .draw_series(LineSeries::new(shown, stroke))?
                .label(name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20 * scale as i32, y)], stroke));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .legend_area_size(px(28))
            .label_font(font(13))
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
        Ok(())
    }
}

/// Encode 8-bit RGB pixels as a PNG file.
fn write_png(path: &Path, (w, h): (u32, u32), rgb: &[u8]) -> anyhow::Result<()> {
    use anyhow::Context;
    let file = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut encoder = png::Encoder::new(std::io::BufWriter::new(file), w, h);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header().with_context(|| format!("writing {}", path.display()))?;
    writer.write_image_data(rgb).with_context(|| format!("writing {}", path.display()))?;
    writer.finish().with_context(|| format!("writing {}", path.display()))?;
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
    fn each_chart_is_also_a_png_twice_the_size_with_its_text_drawn() {
        let dir = tempfile::tempdir().unwrap();
        let curves = [("a".to_string(), vec![(0.0, 0.0), (10.0, 50.0)])];
        let caption_band = |title: &str| {
            let svg = dir.path().join(format!("{}.svg", title.len()));
            lines(&svg, title, ("x", "y"), Axes::Full, &[], &curves).unwrap();
            let file = std::fs::File::open(svg.with_extension("png")).unwrap();
            let mut reader = png::Decoder::new(std::io::BufReader::new(file)).read_info().unwrap();
            let mut pixels = vec![0; reader.output_buffer_size().unwrap()];
            let info = reader.next_frame(&mut pixels).unwrap();
            assert_eq!((info.width, info.height), (1800, 1120));
            assert_eq!(info.color_type, png::ColorType::Rgb);
            // Above the plot: margin 32 px and the 40 px caption at twice the size.
            pixels.truncate((info.width * 72 * 3) as usize);
            pixels
        };
        let (a, b) = (caption_band("Allocation"), caption_band("Fragmentation ratio"));
        assert!(a.iter().any(|&c| c < 128) && b.iter().any(|&c| c < 128), "the titles' glyphs are drawn");
        assert_ne!(a, b, "different titles, different pixels");
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
