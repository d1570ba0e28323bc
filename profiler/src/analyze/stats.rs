//! The little statistics a comparison of two runs needs: a sample's
//! summary, and whether two samples' means differ beyond their spread
//! (Welch's t-test, which does not assume equal variances: a fix often
//! changes the spread as well as the mean).

/// A sample's summary.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Summary {
    pub n: usize,
    pub mean: f64,
    /// The sample standard deviation (n − 1); 0 for fewer than 2 values.
    pub sd: f64,
    pub median: f64,
    pub p90: f64,
}

impl Summary {
    pub fn of(values: &[f64]) -> Summary {
        let n = values.len();
        if n == 0 {
            return Summary::default();
        }
        let mean = values.iter().sum::<f64>() / n as f64;
        let sd = if n > 1 {
            (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1) as f64).sqrt()
        } else {
            0.0
        };
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        Summary {
            n,
            mean,
            sd,
            median: quantile(&sorted, 0.5),
            p90: quantile(&sorted, 0.9),
        }
    }
}

/// The `q` quantile of sorted values, interpolated between neighbours.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    let at = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (at.floor() as usize, at.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (at - lo as f64)
}

/// How two samples' means compare.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Comparison {
    /// new − base.
    pub difference: f64,
    /// Two-sided p-value: how often a difference this large would come
    /// from the spread alone.
    pub p_value: f64,
    /// Half the width of the 99% interval around `difference`.
    pub margin99: f64,
}

/// Welch's t-test of `new`'s mean against `base`'s. None when either has
/// fewer than two values (no spread to judge by).
pub fn welch(base: &Summary, new: &Summary) -> Option<Comparison> {
    if base.n < 2 || new.n < 2 {
        return None;
    }
    let difference = new.mean - base.mean;
    let (v1, v2) = (
        base.sd * base.sd / base.n as f64,
        new.sd * new.sd / new.n as f64,
    );
    let se = (v1 + v2).sqrt();
    if se == 0.0 {
        // No spread at all: any difference is certain, none is none.
        let p_value = if difference == 0.0 { 1.0 } else { 0.0 };
        return Some(Comparison {
            difference,
            p_value,
            margin99: 0.0,
        });
    }
    // Welch–Satterthwaite degrees of freedom.
    let df = (v1 + v2).powi(2) / (v1 * v1 / (base.n - 1) as f64 + v2 * v2 / (new.n - 1) as f64);
    let t = difference / se;
    Some(Comparison {
        difference,
        p_value: two_sided_p(t, df),
        margin99: t_quantile(0.995, df) * se,
    })
}

/// P(|T| ≥ |t|) for Student's t with `df` degrees of freedom.
pub fn two_sided_p(t: f64, df: f64) -> f64 {
    let x = df / (df + t * t);
    incomplete_beta(df / 2.0, 0.5, x).clamp(0.0, 1.0)
}

/// The `p` quantile of Student's t with `df` degrees of freedom (p > 0.5),
/// by bisection on the distribution function.
fn t_quantile(p: f64, df: f64) -> f64 {
    let tail = 2.0 * (1.0 - p);
    let (mut lo, mut hi) = (0.0f64, 1.0f64);
    while two_sided_p(hi, df) > tail {
        hi *= 2.0;
        if hi > 1e6 {
            return hi;
        }
    }
    for _ in 0..100 {
        let mid = (lo + hi) / 2.0;
        if two_sided_p(mid, df) > tail {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    (lo + hi) / 2.0
}

/// The regularized incomplete beta function I_x(a, b), by its continued
/// fraction (Lentz's method), as in Numerical Recipes' `betai`.
fn incomplete_beta(a: f64, b: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let ln_front = ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln();
    let front = ln_front.exp();
    if x < (a + 1.0) / (a + b + 2.0) {
        front * beta_fraction(a, b, x) / a
    } else {
        1.0 - front * beta_fraction(b, a, 1.0 - x) / b
    }
}

fn beta_fraction(a: f64, b: f64, x: f64) -> f64 {
    const TINY: f64 = 1e-300;
    let (qab, qap, qam) = (a + b, a + 1.0, a - 1.0);
    let floor = |v: f64| if v.abs() < TINY { TINY } else { v };
    let mut c = 1.0;
    let mut d = 1.0 / floor(1.0 - qab * x / qap);
    let mut h = d;
    // One step of the fraction: its term `aa`, the factor it multiplies in.
    let mut step = |aa: f64| {
        d = 1.0 / floor(1.0 + aa * d);
        c = floor(1.0 + aa / c);
        d * c
    };
    for m in 1..300 {
        let m = m as f64;
        let m2 = 2.0 * m;
        h *= step(m * (b - m) * x / ((qam + m2) * (a + m2)));
        let delta = step(-(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)));
        h *= delta;
        if (delta - 1.0).abs() < 1e-15 {
            break;
        }
    }
    h
}

/// ln Γ(x) for x > 0 (Lanczos, g = 7, n = 9).
fn ln_gamma(x: f64) -> f64 {
    const G: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection: Γ(x)Γ(1 − x) = π / sin(πx).
        return (std::f64::consts::PI / (std::f64::consts::PI * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut sum = G[0];
    for (i, g) in G.iter().enumerate().skip(1) {
        sum += g / (x + i as f64);
    }
    let t = x + 7.5;
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + sum.ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) -> bool {
        (a - b).abs() <= tol
    }

    #[test]
    fn student_t_matches_its_tables() {
        // Two-sided critical values: t(0.975, 4) = 2.776, t(0.995, 10) =
        // 3.169, t(0.975, 30) = 2.042; large df tends to the normal's 1.960.
        assert!(close(two_sided_p(2.776, 4.0), 0.05, 1e-3));
        assert!(close(two_sided_p(3.169, 10.0), 0.01, 1e-3));
        assert!(close(two_sided_p(2.042, 30.0), 0.05, 1e-3));
        assert!(close(two_sided_p(1.960, 1e6), 0.05, 1e-3));
        assert!(close(two_sided_p(0.0, 7.0), 1.0, 1e-12));
        assert!(close(t_quantile(0.995, 10.0), 3.169, 2e-3));
    }

    #[test]
    fn summaries() {
        let s = Summary::of(&[1.0, 2.0, 3.0, 4.0, 10.0]);
        assert_eq!((s.n, s.mean, s.median), (5, 4.0, 3.0));
        assert!(close(s.sd, 12.5f64.sqrt(), 1e-12));
        assert!(close(s.p90, 7.6, 1e-12));
        assert_eq!(Summary::of(&[]).n, 0);
    }

    #[test]
    fn welch_tells_a_shift_from_noise() {
        // Wikipedia's first Welch example (scipy: t = -2.455, df = 24.99,
        // p = 0.02138).
        let a = [
            27.5, 21.0, 19.0, 23.6, 17.0, 17.9, 16.9, 20.1, 21.9, 22.6, 23.1, 19.6, 19.0, 21.7,
            21.4,
        ];
        let b = [
            27.1, 22.0, 20.8, 23.4, 23.4, 23.5, 25.8, 22.0, 24.8, 20.2, 21.9, 22.1, 22.9, 20.5,
            24.4,
        ];
        let c = welch(&Summary::of(&a), &Summary::of(&b)).unwrap();
        assert!(close(c.p_value, 0.02138, 2e-5), "{c:?}");
        // The same sample against itself: nothing.
        let same = welch(&Summary::of(&a), &Summary::of(&a)).unwrap();
        assert_eq!(same.difference, 0.0);
        assert!(close(same.p_value, 1.0, 1e-12));
        assert!(welch(&Summary::of(&[1.0]), &Summary::of(&a)).is_none());
    }
}
