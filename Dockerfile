# paretoplan: the service (`paretoplan serve`) and its workers (`paretoplan worker`), CPU torch.
# For GPU workers build FROM an image with CUDA and install the matching torch wheel instead.
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app

# torch first, from the CPU wheel index (PyPI's default wheel pulls gigabytes of CUDA libraries)
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0

COPY pyproject.toml README.md ./
COPY search ./search
COPY profiler ./profiler
COPY service ./service
COPY worker ./worker
COPY web ./web
COPY paretoplan ./paretoplan
RUN pip install . && useradd --create-home paretoplan

USER paretoplan
EXPOSE 8000
# migrations run on start; DATABASE_URL (or PARETOPLAN_DATABASE_URL) names the database. Auth is on:
# give PARETOPLAN_ADMIN_TOKEN and PARETOPLAN_WORKER_TOKEN (docker-compose.yml says how), or the
# server makes its own at each start and prints the login link in its log.
CMD ["paretoplan", "serve", "--host", "0.0.0.0", "--port", "8000", "--no-worker"]
