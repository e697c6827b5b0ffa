"""Whether a difference over seeds is more than noise: Welch's two-sided t-test (no scipy needed).

    from stats import welch
    welch(variant_losses, reference_losses)  # {'diff', 't', 'df', 'p', 'low', 'high'}: low..high the 95% interval

The test needs only each side's mean, standard deviation and count, so a table's "mean ± std (n seeds)" can be
tested as printed (the README's Results table is, row by row):

    python stats.py 1.6246 0.0100 3 1.6328 0.0061 3    # variant's mean std n, then the reference's
"""
import math
import sys


def _beta_fraction(a, b, x):
    """The continued fraction of the incomplete beta function, evaluated by the modified Lentz method."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        # two steps per m: the even term m(b-m)x / ((a+2m-1)(a+2m)), then the odd one
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def incomplete_beta(a, b, x):
    """The regularized incomplete beta function I_x(a, b), for a, b > 0 and x in [0, 1]."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    # the fraction converges fast only below (a+1)/(a+b+2); above it, by the symmetry I_x(a,b) = 1 - I_{1-x}(b,a)
    if x < (a + 1) / (a + b + 2):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def t_two_sided_p(t, df):
    """P(|T| >= |t|) for Student's t with df degrees of freedom (df may be fractional, as Welch's is)."""
    if math.isinf(df):
        return math.erfc(abs(t) / math.sqrt(2))
    return incomplete_beta(df / 2, 0.5, df / (df + t * t))


def t_critical(df, p=0.05):
    """The |t| whose two-sided p-value is p (bisection: the p-value falls as |t| grows)."""
    low, high = 0.0, 1.0
    while t_two_sided_p(high, df) > p:
        high *= 2
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if t_two_sided_p(middle, df) > p else (low, middle)
    return (low + high) / 2


def _mean_var(xs):
    mean = sum(xs) / len(xs)
    return mean, sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)


def welch(a, b, level=0.95):
    """Welch's two-sided t-test of mean(a) - mean(b), samples of unequal variance: {'diff', 't', 'df', 'p',
    'low', 'high'} (low..high: the `level` interval of the difference), or None with fewer than 2 values in
    either (no variance to test against)."""
    if len(a) < 2 or len(b) < 2:
        return None
    (mean_a, var_a), (mean_b, var_b) = _mean_var(a), _mean_var(b)
    return welch_summary(mean_a, var_a ** 0.5, len(a), mean_b, var_b ** 0.5, len(b), level)


def welch_summary(mean_a, std_a, n_a, mean_b, std_b, n_b, level=0.95):
    """welch() from each side's mean, sample standard deviation and count (a table's "mean ± std")."""
    if n_a < 2 or n_b < 2:
        return None
    diff = mean_a - mean_b
    se_a, se_b = std_a ** 2 / n_a, std_b ** 2 / n_b
    se2 = se_a + se_b
    if se2 == 0:  # no spread at all: any difference is certain, none is none
        p = 1.0 if diff == 0 else 0.0
        return {'diff': diff, 't': math.copysign(math.inf, diff) if diff else 0.0, 'df': math.inf, 'p': p,
                'low': diff, 'high': diff}
    t = diff / math.sqrt(se2)
    # Welch-Satterthwaite: the degrees of freedom of a sum of two scaled variances
    df = se2 ** 2 / ((se_a ** 2 / (n_a - 1) if se_a else 0.0) + (se_b ** 2 / (n_b - 1) if se_b else 0.0))
    half = t_critical(df, 1 - level) * math.sqrt(se2)
    return {'diff': diff, 't': t, 'df': df, 'p': t_two_sided_p(t, df), 'low': diff - half, 'high': diff + half}


def main(argv):
    """`python stats.py MEAN STD N MEAN STD N`: the difference, its 95% interval and p, one line."""
    usage = "usage: python stats.py MEAN STD N REF_MEAN REF_STD REF_N (each side's mean, sample std, seeds)"
    if len(argv) != 6:
        sys.exit(usage)
    try:
        mean_a, std_a, mean_b, std_b = (float(argv[i]) for i in (0, 1, 3, 4))
        n_a, n_b = int(argv[2]), int(argv[5])
    except ValueError:
        sys.exit(f"{usage}; got {' '.join(argv)!r}")
    if n_a < 2 or n_b < 2 or std_a < 0 or std_b < 0:
        sys.exit(f"each side needs N >= 2 seeds and a std >= 0 to test; got {' '.join(argv)!r}")
    test = welch_summary(mean_a, std_a, n_a, mean_b, std_b, n_b)
    verdict = 'noise could explain it (p >= 0.05)' if test['p'] >= 0.05 else 'more than noise (p < 0.05)'
    print(f"difference {test['diff']:+.4f}, 95% interval [{test['low']:+.4f}, {test['high']:+.4f}], "
          f"Welch p {test['p']:.2g} (t {test['t']:.2f}, df {test['df']:.1f}): {verdict}")


if __name__ == '__main__':
    main(sys.argv[1:])
