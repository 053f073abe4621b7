import io
import pickle

# raftq: protocol 5 instead of 2. Protocol 2 has no bytes type: every job payload went through
# codecs.encode(latin-1 text), 10x slower to pickle and unpickle and 1.5x bigger (a 256-job
# command: 380 us -> 40 us to pickle, 116 KB -> 75 KB). Every node of a cluster runs the same.
__protocol = 5


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


# raftq: files that hold builtins only (snapshots, the meta file) are written and read so that
# they can neither depend on a class path nor run code when loaded.
class BuiltinsPickler(pickle.Pickler):
    """Pickles builtins only: None, bool, int, float, str, bytes, bytearray, tuple, list, dict,
    set, frozenset (exact types). Anything else - a class instance, a subclass of a builtin, a
    function - raises PicklingError instead of being written as a global."""

    def reducer_override(self, obj):
        # Not called for the exact builtin types above (pickle's own fast paths).
        raise pickle.PicklingError('not a builtin: %s.%s' % (type(obj).__module__, type(obj).__qualname__))


class GlobalRefused(pickle.UnpicklingError):
    pass


class BuiltinsUnpickler(pickle.Unpickler):
    """Refuses every global (GLOBAL, STACK_GLOBAL, INST, OBJ, EXT*: all go through find_class),
    so nothing but builtins can be built and nothing can be called (REDUCE needs a global)."""

    def find_class(self, module, name):
        raise GlobalRefused('refusing the global %s.%s: only builtins are read here' % (module, name))


def dumpBuiltins(obj, file):
    BuiltinsPickler(file, __protocol).dump(obj)


def loadBuiltins(file):
    return BuiltinsUnpickler(file).load()


def loadsBuiltins(data):
    return BuiltinsUnpickler(io.BytesIO(to_bytes(data))).load()
