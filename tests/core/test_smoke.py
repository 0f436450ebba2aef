from tests.core.builders import Cluster, Run


def test_whole_gpus_fill_a_node() -> None:
    c = Cluster().pool("h100", nodes=1, gpus=8).project("a", deserved=8)
    c.submit("w1", "a", gpus=4).submit("w2", "a", gpus=4).submit("w3", "a", gpus=1)
    run = Run(c.snapshot()).settle()
    assert run.running() == {"w1", "w2"}
    assert run.reason("w3") == "no-node-fits"
