"""One device, no wrapper: the baseline."""

from strategies.base import Strategy


class SingleDevice(Strategy):
    pass
