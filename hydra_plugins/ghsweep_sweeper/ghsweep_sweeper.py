"""The sweeper `hydra/sweeper=tune` names; Hydra instantiates sweepers only from hydra_plugins.

Everything it does is in ghsweep.tune.sweeper.
"""

from ghsweep.tune import sweeper


class TuneSweeper(sweeper.TuneSweeper):
    pass
