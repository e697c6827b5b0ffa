"""stats.py: Welch's t-test against closed forms and published values."""
import math

import pytest

from stats import incomplete_beta, main, t_critical, t_two_sided_p, welch, welch_summary


@pytest.mark.parametrize("t", [0.0, 0.3, 1.0, 2.5, 12.7, 300.0])
def test_the_t_tail_matches_its_closed_forms(t):
    # df=1 is the Cauchy distribution, df=2 has a closed form too, df=inf is the normal
    assert t_two_sided_p(t, 1) == pytest.approx(1 - 2 / math.pi * math.atan(t), rel=1e-10, abs=1e-15)
    assert t_two_sided_p(t, 2) == pytest.approx(1 - t / math.sqrt(t * t + 2), rel=1e-10, abs=1e-15)
    normal = math.erfc(t / math.sqrt(2))
    assert t_two_sided_p(-t, math.inf) == normal
    if t < 5:  # many degrees of freedom: near the normal (the tails differ most)
        assert t_two_sided_p(-t, 1e4) == pytest.approx(normal, rel=2e-3, abs=1e-15)


@pytest.mark.parametrize("df, critical", [(1, 12.7062047), (4, 2.7764451), (10, 2.2281389), (30, 2.0422725)])
def test_the_tables_5_percent_critical_values(df, critical):
    assert t_two_sided_p(critical, df) == pytest.approx(0.05, abs=1e-8)
    assert t_critical(df) == pytest.approx(critical, abs=1e-6)


@pytest.mark.parametrize("a, b, x, expected", [  # scipy.special.betainc
    (0.5, 0.5, 0.3, 0.36901011956554536), (5, 0.5, 0.9, 0.3166429150200122),
    (1.2, 0.5, 0.01, 0.0018573832140289343), (30, 0.5, 0.99, 0.43933436890525074),
    (2.5, 3.5, 0.6, 0.8196850658677839)])
def test_the_incomplete_beta(a, b, x, expected):
    assert incomplete_beta(a, b, x) == pytest.approx(expected, rel=1e-12)


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
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert says in str(exit_.value) and '\n' not in str(exit_.value)


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
