"""Small statistics helpers."""


def mean(values):
    if not values:
        raise ValueError("mean of empty list")
    return sum(values) / len(values)


def median(values):
    # BUG: assumes sorted input and odd length
    return values[len(values) // 2]


def spread(values):
    return max(values) - min(values)
