"""What the routing benchmarks' tables share (benches/goodput_table.py,
benches/conversations_table.py)."""
import statistics


def med(xs):
    """The median, or NaN for no values."""
    return statistics.median(xs) if xs else float("nan")


def at95(points):
    """The highest rate at 95% attainment from `(rate, attainment)` points in rising rate,
    linear between measured rates (an arm at 95% everywhere gives the top rate)."""
    best = 0.0
    for (r0, a0), (r1, a1) in zip([(0.0, 1.0)] + points, points):
        if a1 >= 0.95:
            best = r1
        elif a0 >= 0.95:
            return r0 + (r1 - r0) * (a0 - 0.95) / (a0 - a1)
        else:
            break
    return best
