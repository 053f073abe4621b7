import pickle

__protocol = 2


def to_bytes(data):
    return data if isinstance(data, bytes) else data.encode('utf-8')


def load(file):
    return pickle.load(file)


def loads(data):
    return pickle.loads(to_bytes(data))


def dump(obj, file, protocol=None):
    pickle.dump(obj, file, __protocol)


def dumps(obj, protocol=None):
    return pickle.dumps(obj, __protocol)
