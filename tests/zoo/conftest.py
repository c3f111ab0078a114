def pytest_configure(config):
    config.addinivalue_line(
        "markers", "zoo_heavy: a zoo model whose compile and run dominate the zoo's time (deselect: -m 'not zoo_heavy')")
