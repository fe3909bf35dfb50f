# The wheelhouse (build/wheelhouse, made on the host by `make images`) as an image of its own,
# pflarena-wheelhouse:<digest of its inputs>, so that docker/Dockerfile copies the wheels
# from it (its stage `wheelhouse`) and the build context of every image stays small: the
# classic builder sends the whole context on every build, ~3.4 GB with torch's CUDA wheels.
# Built with build/wheelhouse as the context, once per change of the wheelhouse.
FROM scratch
LABEL pflarena.stage=wheelhouse
COPY . /wheels/
