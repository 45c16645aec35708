# chatloom: the API server with its inference engine (CPU build; see the GPU note below).
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    CHATLOOM_CACHE=/var/cache/chatloom \
    CHATLOOM_DATA_DIR=/app/data \
    CHATLOOM_HOST=0.0.0.0 \
    CHATLOOM_PORT=8000

WORKDIR /app

# torch first, from the CPU index, so nothing pulls a CUDA build (for a GPU image start from an
# nvidia/cuda base and install torch + the `triton` extra instead)
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu

COPY pyproject.toml setup.py README.md alembic.ini ./
COPY chatloom ./chatloom
COPY app ./app
COPY engine ./engine
COPY runner ./runner
COPY models ./models
COPY kernels ./kernels
COPY grammar ./grammar
COPY migrations ./migrations
COPY examples ./examples
RUN pip install . && useradd --create-home chatloom && mkdir -p /var/cache/chatloom /app/data \
    && chown -R chatloom /var/cache/chatloom /app/data

USER chatloom
EXPOSE 8000
VOLUME ["/var/cache/chatloom", "/app/data"]
HEALTHCHECK --interval=15s --timeout=5s --start-period=180s \
    CMD python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"

# migrations run on start (Alembic, to head); `alembic upgrade head` does the same by hand
CMD ["chatloom", "serve"]
