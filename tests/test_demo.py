"""``make demo`` shows the build's own defaults: the ranker ``aheadrank build`` picks when given none."""

from aheadrank import build, demo


def test_the_demo_builds_the_default_ranker():
    assert demo.RANKERS[0] == build.DEFAULT_RANKER
    assert len(set(demo.RANKERS)) == len(demo.RANKERS)
