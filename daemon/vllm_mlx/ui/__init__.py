"""The status page's static files (index.html, dashboard.js, dashboard.css), served at /ui."""
