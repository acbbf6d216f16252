"""``make demo`` shows the build's own defaults: the ranker ``aheadrank build`` picks when given none, and every
other choice it offers is one the build can make."""

from aheadrank import build, demo


def test_the_demo_builds_the_default_ranker_and_offers_buildable_ones():
    assert demo.RANKERS[0] == build.DEFAULT_RANKER
    assert len(set(demo.RANKERS)) == len(demo.RANKERS)
    for name in demo.RANKERS:
        assert build._variant(name).name, name
