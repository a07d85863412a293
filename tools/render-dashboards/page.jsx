// One page that shows a Perses dashboard the way the Perses UI does (ViewDashboard and
// the upstream panel plugins), against one Prometheus given by URL. The page is driven by
// tools/render_dashboards.py: it reads ?dashboard=<path of the JSON>&prometheus=<url>,
// plus Perses' own start/end/var-* query parameters, and sets window.renderState to
// "ready" once every query of every open panel has settled, with a report of each
// query (window.renderReport) for the test to judge.
import React from 'react';
import { createRoot } from 'react-dom/client';
import { BrowserRouter } from 'react-router-dom';
import { QueryParamProvider } from 'use-query-params';
import { ReactRouter6Adapter } from 'use-query-params/adapters/react-router-6';
import { QueryClient, QueryClientProvider } from '@tanstack/react-query';
import { CssBaseline, ThemeProvider, Typography } from '@mui/material';
import { ChartsProvider, SnackbarProvider, generateChartsTheme, getTheme } from '@perses-dev/components';
import { PluginRegistry, dynamicImportPluginLoader } from '@perses-dev/plugin-system';
import { ViewDashboard } from '@perses-dev/dashboards';
import * as prometheus from '@perses-dev/prometheus-plugin';
import * as timeseries from '@perses-dev/timeseries-chart-plugin';
import * as stat from '@perses-dev/stat-chart-plugin';
import * as statusHistory from '@perses-dev/status-history-chart-plugin';
import * as table from '@perses-dev/table-plugin';
import '@fontsource/lato/400.css';
import '@fontsource/lato/700.css';

const params = new URLSearchParams(window.location.search);
const DATASOURCE = 'prometheus';

const pluginLoader = dynamicImportPluginLoader(
  [prometheus, timeseries, stat, statusHistory, table].map((module) => ({
    resource: module.getPluginModule(),
    importPlugin: () => Promise.resolve(module),
  }))
);

// The dashboard's queries name no datasource: they get the project's default, this one.
const datasource = {
  kind: 'GlobalDatasource',
  metadata: { name: DATASOURCE },
  spec: {
    default: true,
    plugin: { kind: 'PrometheusDatasource', spec: { directUrl: params.get('prometheus'), scrapeInterval: '1s' } },
  },
};
const datasourceApi = {
  getDatasource: async () => undefined,
  getGlobalDatasource: async (selector) => (selector.kind === 'PrometheusDatasource' ? datasource : undefined),
  listDatasources: async () => [],
  listGlobalDatasources: async (kind) => (kind === undefined || kind === 'PrometheusDatasource' ? [datasource] : []),
};

const queryClient = new QueryClient({ defaultOptions: { queries: { refetchOnWindowFocus: false, retry: false } } });

// Screenshots of charts half-way through their entry animation would show wrong lines.
const muiTheme = getTheme('light');
const chartsTheme = generateChartsTheme(muiTheme, { echartsTheme: { animation: false } });

const finite = (values) => (values ?? []).map(([, v]) => v).filter((v) => v !== null && Number.isFinite(Number(v)));

// Every time series query in the cache: its expression, state, error and how much data it gave.
function report() {
  return queryClient
    .getQueryCache()
    .findAll({ type: 'active' })
    .filter((q) => q.queryKey?.[0]?.kind === 'TimeSeriesQuery')
    .map((q) => ({
      query: q.queryKey[0].spec.plugin.spec.query,
      status: q.state.status,
      fetching: q.state.fetchStatus === 'fetching',
      error: q.state.error ? String(q.state.error.message ?? q.state.error) : null,
      series: q.state.data?.series?.length ?? 0,
      values: (q.state.data?.series ?? []).reduce((n, s) => n + finite(s.values).length, 0),
      // The last value of each series: what a stat or a table shows.
      last: (q.state.data?.series ?? []).map((s) => finite(s.values).length ? Number(finite(s.values).pop()) : null),
    }));
}

// Ready: the expected number of queries exist, none is loading, no panel shows a skeleton,
// and that held over two checks (a settled query can enable a dependent one).
function watchUntilReady(expected) {
  let calm = 0;
  const timer = setInterval(() => {
    const queries = report();
    const loading =
      queries.some((q) => q.fetching || q.status === 'loading') ||
      document.querySelector('[aria-label="Loading..."]') !== null;
    calm = !loading && queries.length >= expected ? calm + 1 : 0;
    window.renderReport = { queries, panels: panelStates() };
    if (calm >= 2) {
      clearInterval(timer);
      requestAnimationFrame(() => requestAnimationFrame(() => (window.renderState = 'ready')));
    }
  }, 250);
}

// What a person sees per panel: its title and whether it shows an error.
function panelStates() {
  return Array.from(document.querySelectorAll('[data-testid="panel"]')).map((panel) => {
    const title = (document.getElementById(panel.getAttribute("aria-labelledby"))?.textContent ?? "").trim();
    const error = panel.querySelector('[aria-label="panel errors"], [role="alert"]');
    return { title, error: error ? error.textContent || 'error' : null };
  });
}

async function main() {
  window.renderState = 'loading';
  const response = await fetch(params.get('dashboard'));
  const dashboard = await response.json();
  const openPanels = dashboard.spec.layouts
    .filter((layout) => layout.spec.display?.collapse?.open !== false)
    .flatMap((layout) => layout.spec.items.map((item) => item.content.$ref.split('/').pop()));
  const expected = new Set(
    openPanels.flatMap((key) => (dashboard.spec.panels[key].spec.queries ?? []).map((q) => q.spec.plugin.spec.query))
  ).size;
  createRoot(document.getElementById('root')).render(
    <BrowserRouter>
      <QueryParamProvider adapter={ReactRouter6Adapter}>
        <ThemeProvider theme={muiTheme}>
          <CssBaseline />
          <ChartsProvider chartsTheme={chartsTheme}>
            <SnackbarProvider anchorOrigin={{ vertical: 'top', horizontal: 'center' }}>
              <QueryClientProvider client={queryClient}>
                <PluginRegistry pluginLoader={pluginLoader}>
                  <ViewDashboard
                    dashboardResource={dashboard}
                    datasourceApi={datasourceApi}
                    isReadonly
                    isEditing={false}
                    isVariableEnabled
                    isDatasourceEnabled={false}
                    dashboardTitleComponent={<Typography variant="h2">{dashboard.spec.display.name}</Typography>}
                  />
                </PluginRegistry>
              </QueryClientProvider>
            </SnackbarProvider>
          </ChartsProvider>
        </ThemeProvider>
      </QueryParamProvider>
    </BrowserRouter>
  );
  watchUntilReady(expected);
}

main().catch((error) => {
  window.renderState = `failed: ${error}`;
});
