"""stats.py: Welch's t-test against closed forms, published values and scipy, and its command line's refusals."""
import math

import pytest

from stats import main, t_critical, t_two_sided_p, welch, welch_summary


@pytest.mark.parametrize("t", [0.0, 0.3, 1.0, 2.5, 12.7, 300.0])
def test_the_t_tail_matches_its_closed_forms(t):
    # one side without spread: Welch's df is the other side's n - 1; df=1 is the Cauchy distribution, df=2 has a
    # closed form too (the difference t * sqrt(1 / 2) gives t with a std of 1 over 2 seeds; sqrt(1 / 3) over 3)
    cauchy = welch_summary(t * math.sqrt(0.5), 1.0, 2, 0.0, 0.0, 2)
    assert cauchy['df'] == pytest.approx(1.0) and cauchy['t'] == pytest.approx(t)
    assert cauchy['p'] == pytest.approx(1 - 2 / math.pi * math.atan(t), rel=1e-10, abs=1e-15)
    two = welch_summary(0.0, 1.0, 3, t * math.sqrt(1 / 3), 0.0, 5)
    assert two['df'] == pytest.approx(2.0) and two['p'] == pytest.approx(1 - t / math.sqrt(t * t + 2), rel=1e-10,
                                                                          abs=1e-15)


@pytest.mark.parametrize("df, critical", [(1, 12.7062047), (4, 2.7764451), (10, 2.2281389), (30, 2.0422725),
                                          (math.inf, 1.9599640)])
def test_the_tables_5_percent_critical_values(df, critical):
    assert t_two_sided_p(critical, df) == pytest.approx(0.05, abs=1e-8)
    assert t_critical(df) == pytest.approx(critical, abs=1e-6)


@pytest.mark.parametrize("summary", [(1.6246, 0.0100, 3, 1.6328, 0.0061, 3), (1.6803, 0.0133, 2, 2.3595, 0.2353, 2),
                                     (0.5, 1.0, 50, 0.7, 2.0, 7), (3.0, 1e-3, 3, 2.0, 1e-3, 4)])
def test_the_p_value_is_scipys(summary):
    """Not a hand-made t distribution (issue 43): scipy's Welch test from the same figures, to float rounding,
    and p exactly scipy's Student's t tail at that t and df."""
    from scipy.stats import t as student_t, ttest_ind_from_stats
    t, p = ttest_ind_from_stats(*summary, equal_var=False)
    result = welch_summary(*summary)
    assert (result['t'], result['p']) == pytest.approx((t, p), rel=1e-13)
    assert result['p'] == 2 * student_t.sf(abs(result['t']), result['df'])


@pytest.mark.parametrize("a, b, expected", [  # scipy.stats.ttest_ind(a, b, equal_var=False): p, t, df, 95% interval
    ([1.465, 1.471, 1.468], [1.480, 1.478, 1.485],
     (0.009371106780044502, -4.800568148193968, 3.872, -0.020617693983591777, -0.0053823060164084665)),
    ([3.1, 2.9, 3.4, 3.0], [2.0, 5.5], (0.7736250187436162, -0.3707231034195925, 1.0076286856964562,
                                        -22.53352172154121, 21.233521721541212)),
    ([0.5, 0.52, 0.49, 0.51, 0.50], [0.5, 0.5001, 0.4999],
     (0.47663650049591255, 0.7844142591989329, 4.001025575245707, -0.010156624117350257, 0.018156624117350265)),
])
def test_welch_matches_scipy(a, b, expected):
    result = welch(a, b)
    got = tuple(result[k] for k in ('p', 't', 'df', 'low', 'high'))
    assert got == pytest.approx(expected, rel=1e-9)
    assert result['diff'] == pytest.approx(sum(a) / len(a) - sum(b) / len(b))


def test_welch_without_spread_or_seeds():
    assert welch([1.0], [1.0, 2.0]) is None  # one seed: no variance to test against
    assert welch([2.0, 2.0], [1.0, 1.0])['p'] == 0.0
    assert welch([1.0, 1.0], [1.0, 1.0])['p'] == 1.0
    # one side without spread: the other's variance alone, with its n - 1 degrees of freedom
    result = welch([1.0, 1.0, 1.0], [0.0, 0.5, 1.0])  # t = 0.5 / sqrt(0.25 / 3) = sqrt(3)
    assert result['df'] == pytest.approx(2.0) and result['t'] == pytest.approx(math.sqrt(3))
    assert result['p'] == pytest.approx(1 - math.sqrt(3) / math.sqrt(3 + 2))


def test_a_tables_mean_and_std_give_the_same_test_as_its_seeds():
    a, b = [1.465, 1.471, 1.468], [1.480, 1.478, 1.485, 1.475]
    mean_std = lambda xs: (sum(xs) / len(xs), (sum((x - sum(xs) / len(xs)) ** 2 for x in xs) / (len(xs) - 1)) ** 0.5)
    summary = welch_summary(*mean_std(a), len(a), *mean_std(b), len(b))
    assert summary == pytest.approx(welch(a, b), rel=1e-12)
    assert welch_summary(1.0, 0.1, 1, 1.0, 0.1, 3) is None


def refused(capsys, argv):
    """main(argv) refused: exit status 2 and one line on stderr, nothing on stdout; the line."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    out, err = capsys.readouterr()
    assert exit_.value.code == 2 and not out and err.count('\n') == 1, (exit_.value.code, out, err)
    return err


def test_the_command_line_prints_the_test_and_refuses_what_it_cannot_test(capsys):
    main(['1.6246', '0.0100', '3', '1.6328', '0.0061', '3'])
    line = capsys.readouterr().out
    p = welch_summary(1.6246, 0.0100, 3, 1.6328, 0.0061, 3)['p']
    assert line.startswith('difference -0.0082, 95% interval [') and f"Welch p {p:.2g} " in line
    assert line.rstrip().endswith('noise could explain it (p >= 0.05)')
    main(['1.5683', '0.0060', '3', '1.6327', '0.0061', '3'])
    assert capsys.readouterr().out.rstrip().endswith('more than noise (p < 0.05)')
    for argv, says in ((['1', '2'], 'usage: python stats.py'), (['1', 'x', '3', '1', '0.1', '3'], "got '1 x 3 1 0.1 3'"),
                       (['1', '0.1', '1', '1', '0.1', '3'], 'N >= 2 seeds')):
        assert says in refused(capsys, argv)


@pytest.mark.parametrize("argv", [['nan', '0.1', '3', '1', '0.1', '3'], ['1', '0.1', '3', '-inf', '0.1', '3'],
                                  ['1', 'nan', '3', '1', '0.1', '3'], ['1', '0.1', '3', '1', 'inf', '3']])
def test_a_mean_or_std_that_is_not_a_number_is_refused(capsys, argv):
    """Not 'Welch p nan ... more than noise' (issue 44): nan or inf is no figure to test."""
    err = refused(capsys, argv)
    assert err.startswith('error: each mean and std must be a finite number') and repr(' '.join(argv)) in err


def test_seeds_whose_squares_overflow_a_float_are_tested():
    result = welch([1e200, 2e200, 3e200], [0.0, 1e200, 2e200])
    assert result['p'] == pytest.approx(welch([1.0, 2.0, 3.0], [0.0, 1.0, 2.0])['p'], rel=1e-12)


def test_nothing_to_test_in_a_nan_seed():
    """A diverged run's nan loss: no test (ablate.py then says 'untested'), not p nan read as significant."""
    assert welch([1.0, float('nan'), 1.2], [1.0, 1.1]) is None
    assert welch([1.0, 1.1], [1.0, float('inf')]) is None
    assert welch_summary(1.0, float('nan'), 3, 1.0, 0.1, 3) is None


def test_figures_beyond_a_floats_square_are_tested_not_overflowed(capsys):
    """A std of 1e200 (its square overflows a float) and 10**400 seeds (no float holds it): the test's answer, as
    the same figures scaled down give it (issue 44: OverflowError tracebacks)."""
    big = welch_summary(1.0, 1e200, 3, 1.0, 1e200, 3)
    small = welch_summary(1e-200, 1.0, 3, 1e-200, 1.0, 3)
    assert (big['t'], big['df'], big['p']) == pytest.approx((small['t'], small['df'], small['p']), rel=1e-12)
    assert big['high'] == pytest.approx(small['high'] * 1e200, rel=1e-12) and big['low'] == -big['high']
    main(['1', '1e200', '3', '1', '1e200', '3'])
    assert capsys.readouterr().out.startswith('difference +0.0000, 95% interval [-2.2670e+200, +2.2670e+200], '
                                              'Welch p 1 (t 0.00, df 4.0)')
    # a side of 10**400 seeds knows its mean exactly: the other side's spread alone, at its n - 1 df
    exact = welch_summary(1.0, 0.1, 10 ** 400, 1.1, 0.1, 3)
    assert exact == pytest.approx(welch_summary(1.0, 0.0, 3, 1.1, 0.1, 3), rel=1e-12)
    main(['1', '0.1', str(10 ** 400), '1.1', '0.1', '3'])
    assert 'df 2.0' in capsys.readouterr().out
    # ... and whatever the other side's spread: 10**400 seeds of std 1 leave a standard error of 1e-200
    tail = welch_summary(1e-250, 1.0, 10 ** 400, 0.0, 1e-300, 3)
    assert tail['t'] == pytest.approx(1e-50, rel=1e-9) and tail['p'] == 1.0 and tail['df'] == math.inf
    # tiny figures: their squares do not underflow into 'no spread at all' (p 0), nor their standard errors'
    # squares into a division by zero
    tiny = welch_summary(1e-300, 1e-300, 3, 0.0, 1e-300, 3)
    assert tiny['p'] == pytest.approx(welch_summary(1.0, 1.0, 3, 0.0, 1.0, 3)['p'], rel=1e-12)
    main(['1', '1e-160', '3', '1.0000001', '1e-160', '3'])
    assert capsys.readouterr().out.startswith('difference -0.0000, 95% interval [-0.0000, -0.0000], Welch p 0 '
                                              '(t -1.22e+153, df 4.0)')
    # a difference beyond a float's range, its t still within: the test; the line refuses what it cannot print
    far = welch_summary(1e308, 1e308, 3, -1e308, 1e308, 3)
    assert far['t'] == pytest.approx(welch_summary(1.0, 1.0, 3, -1.0, 1.0, 3)['t'], rel=1e-12)
    # a difference no float holds: one line
    assert 'beyond a float' in refused(capsys, ['1e308', '0.1', '3', '-1e308', '0.1', '3'])


def test_every_test_in_docs_significance_prints_what_the_page_says(capsys):
    """docs/significance.md quotes each `python stats.py ...` with the line it printed: rerun, each must match."""
    import re
    from pathlib import Path
    text = (Path(__file__).resolve().parent.parent / 'docs' / 'significance.md').read_text(encoding='utf-8')
    pairs = re.findall(r'`python stats\.py ([^`]+)`[^`]*?`(difference [^`]+)`', text)
    assert len(pairs) >= 50
    for argv, printed in pairs:
        main(argv.split())
        assert capsys.readouterr().out.strip() == printed, argv
