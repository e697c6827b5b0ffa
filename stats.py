"""Whether a difference over seeds is more than noise: Welch's two-sided t-test (scipy's).

    from stats import welch
    welch(variant_losses, reference_losses)  # {'diff', 't', 'df', 'p', 'low', 'high'}: low..high the 95% interval

The test needs only each side's mean, standard deviation and count, so a table's "mean ± std (n seeds)" can be
tested as printed (the README's Results table is, row by row):

    python stats.py 1.6246 0.0100 3 1.6328 0.0061 3    # variant's mean std n, then the reference's

Welch's t and degrees of freedom are computed here from the figures, without squaring them (a std of 1e200 or
10**400 seeds are tested, not overflowed); the p-value is scipy's Student's t tail at them, what
scipy.stats.ttest_ind_from_stats(..., equal_var=False) gives for figures within its range, and the interval the
difference ± scipy's t quantile times the standard error. Needs scipy. On the command line a mean or std that is
not a finite number, or a difference beyond a float's range, is one line on stderr and exit status 2.
"""
import importlib.util
import math
import statistics
import sys

USAGE = "usage: python stats.py MEAN STD N REF_MEAN REF_STD REF_N (each side's mean, sample std, seeds)"


def t_critical(df, p=0.05):
    """The |t| whose two-sided p-value is p under Student's t with df degrees of freedom (fractional, as
    Welch's is, or math.inf: the normal)."""
    from scipy.stats import t as student_t
    return float(student_t.ppf(1 - p / 2, df))


def t_two_sided_p(t, df):
    """P(|T| >= |t|) for Student's t with df degrees of freedom: what scipy.stats.ttest_ind_from_stats(...,
    equal_var=False) returns for Welch's t and df."""
    from scipy.stats import t as student_t
    return float(2 * student_t.sf(abs(t), df))


def welch(a, b, level=0.95):
    """Welch's two-sided t-test of mean(a) - mean(b), samples of unequal variance: {'diff', 't', 'df', 'p',
    'low', 'high'} (low..high: the `level` interval of the difference), or None where there is nothing to test:
    fewer than 2 values in either (no variance to test against), or a value that is not a finite number (a
    diverged run's nan loss)."""
    if len(a) < 2 or len(b) < 2 or not all(math.isfinite(x) for x in (*a, *b)):
        return None
    # statistics' mean and stdev are exact before their one rounding: seeds of 1e200 do not overflow a square
    return welch_summary(statistics.mean(a), statistics.stdev(a), len(a), statistics.mean(b), statistics.stdev(b),
                         len(b), level)


def _standard_error(std, n):
    """std / sqrt(n) for any finite std and int n >= 1, as 10**400, which no float holds (no float's square is
    taken either: scipy's std**2 / n overflows at a std of 1e200)."""
    halvings = max(0, (n.bit_length() - 1000) // 2)  # sqrt(n) = 2**halvings * sqrt(n / 4**halvings)
    return math.ldexp(std / math.sqrt(n >> 2 * halvings), -halvings)


def welch_summary(mean_a, std_a, n_a, mean_b, std_b, n_b, level=0.95):
    """welch() from each side's mean, sample standard deviation and count (a table's "mean ± std"); None with
    fewer than 2 values a side or a mean or std that is not a finite number. Welch's t and degrees of freedom are
    computed here (scipy's ttest_ind_from_stats squares the stds and counts in floats, and returns no df), the
    p-value and interval from scipy's Student's t."""
    if n_a < 2 or n_b < 2 or not all(math.isfinite(x) for x in (mean_a, std_a, mean_b, std_b)):
        return None
    diff = mean_a - mean_b  # beyond a float's range only if it truly is
    se_a, se_b = _standard_error(std_a, n_a), _standard_error(std_b, n_b)
    se = math.hypot(se_a, se_b)
    if se == 0:  # no spread at all: any difference is certain, none is none
        p = 1.0 if diff == 0 else 0.0
        return {'diff': diff, 't': math.copysign(math.inf, diff) if diff else 0.0, 'df': math.inf, 'p': p,
                'low': diff, 'high': diff}
    t = (mean_a / 2 - mean_b / 2) / (se / 2)  # halved: a difference beyond a float's range can still give a t
    # Welch-Satterthwaite: the degrees of freedom of a sum of two scaled variances, each side's share of the
    # variance (at most 1) to the 4th power over its n - 1 (infinite past a float's range: its term is then 0)
    terms = [(side / se) ** 4 / (float(n - 1) if n < 2 ** 1000 else math.inf) for side, n in ((se_a, n_a), (se_b, n_b))]
    df = 1 / sum(terms) if any(terms) else math.inf
    half = t_critical(df, 1 - level) * se
    return {'diff': diff, 't': t, 'df': df, 'p': t_two_sided_p(t, df), 'low': diff - half, 'high': diff + half}


def fail(msg):
    print(msg, file=sys.stderr)
    sys.exit(2)


def main(argv):
    """`python stats.py MEAN STD N MEAN STD N`: the difference, its 95% interval and p, one line; what it cannot
    test is one line on stderr and exit status 2."""
    if len(argv) != 6:
        fail(USAGE)
    if importlib.util.find_spec('scipy') is None:
        fail("error: stats.py needs scipy (its Student's t distribution): pip install scipy")
    got = ' '.join(argv)
    try:
        mean_a, std_a, mean_b, std_b = (float(argv[i]) for i in (0, 1, 3, 4))
        n_a, n_b = int(argv[2]), int(argv[5])
    except ValueError:
        fail(f"{USAGE}; got {got!r}")
    if not all(math.isfinite(x) for x in (mean_a, std_a, mean_b, std_b)):
        fail(f"error: each mean and std must be a finite number (not nan or inf); got {got!r}")
    if n_a < 2 or n_b < 2 or std_a < 0 or std_b < 0:
        fail(f"error: each side needs N >= 2 seeds and a std >= 0 to test; got {got!r}")
    test = welch_summary(mean_a, std_a, n_a, mean_b, std_b, n_b)
    if not all(math.isfinite(test[k]) for k in ('diff', 'low', 'high')):
        fail(f"error: the difference of the means or its interval is beyond a float's range (about 1.8e308); got "
             f"{got!r}")
    verdict = 'noise could explain it (p >= 0.05)' if test['p'] >= 0.05 else 'more than noise (p < 0.05)'
    diff, low, high, t = (_figure(test[k], spec) for k, spec in (('diff', '+.4'), ('low', '+.4'), ('high', '+.4'),
                                                                   ('t', '.2')))
    print(f"difference {diff}, 95% interval [{low}, {high}], Welch p {test['p']:.2g} (t {t}, df {test['df']:.1f}): "
          f"{verdict}")


def _figure(x, spec):
    """x formatted as spec + 'f'; past 1e15, where its decimals would be 200 digits of float noise, as spec + 'e'."""
    return f"{x:{spec}f}" if abs(x) < 1e15 else f"{x:{spec}e}"

if __name__ == '__main__':
    main(sys.argv[1:])
